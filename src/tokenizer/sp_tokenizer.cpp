/* src/tokenizer/sp_tokenizer.cpp — the tokenizer half of
 * include/dolphin/tokenizer.h: a thin extern "C" wrapper over
 * libsentencepiece (load, encode, decode, vocabulary queries). This is the
 * only C++ in Dolphin; beyond range checks and copying results into
 * malloc'd buffers, its one piece of logic is the bound behind
 * dol_tokenizer_max_piece_bytes / dol_tokenizer_min_tokens, which reads
 * four settings out of the serialized model (the installed library ships
 * no header for its ModelProto). No exception ever leaves this file:
 * every entry point catches everything and reports through err (or a
 * neutral return value where the API has no err). */
#include "dolphin/tokenizer.h"

#include <sentencepiece_processor.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

struct dol_tokenizer {
    sentencepiece::SentencePieceProcessor sp;
    int vocab = 0;
    int max_piece = 0;         /* dol_tokenizer_max_piece_bytes; 0 = no bound */
    int max_piece_chars = 0;   /* the same counted in characters */
    bool drops_spaces = true;  /* normalizer removes extra whitespace */
};

static bool in_range(const dol_tokenizer *tok, int32_t id)
{
    return tok && id >= 0 && id < tok->vocab;
}

/* ---- the token-count bound ------------------------------------------------
 *
 * With an identity normalizer (no precompiled character map) sentencepiece
 * maps every character of the input to itself, except that a space becomes
 * U+2581 ("▁", 3 bytes for 1), an invalid byte becomes U+FFFD (3 for 1), a
 * "▁" is prepended (add_dummy_prefix) and, with remove_extra_whitespaces,
 * ASCII spaces may be dropped (leading, trailing, repeated), and so may
 * trailing "▁"s of the input (escaped, they look like spaces). Counting "▁" as
 * 1, the normalized text therefore weighs at least as much as the input
 * (without its spaces when they may be dropped), and the encoding splits
 * the normalized text into pieces, each weighing at most the heaviest piece
 * the model can produce. Hence tokens >= weight(input) / heaviest piece.
 * The same holds counting characters instead of bytes (every character maps
 * to one; a byte piece is at most one): the bound used is the larger of the
 * two, bytes being the tighter for CJK text, characters for ASCII. */

/* The settings of the model that the bound depends on, read from the
 * serialized ModelProto (protobuf wire format): trainer_spec (field 2)
 * .model_type (3; UNIGRAM = 1 by default, BPE = 2, WORD = 3, CHAR = 4) and
 * .byte_fallback (35, default false); normalizer_spec (field 3)
 * .precompiled_charsmap (2, empty = identity) and .remove_extra_whitespaces
 * (4, default true). */
struct model_facts {
    uint64_t model_type = 1;
    bool byte_fallback = false;
    bool charsmap = false;
    bool remove_ws = true;
};

/* One protobuf field from [*p, end): its number, wire type, and its varint
 * value (wire type 0) or payload (wire type 2). False on malformed input or
 * a wire type this reader does not know (groups). */
static bool pb_varint(const unsigned char *&p, const unsigned char *end, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
        const unsigned char c = *p++;
        r |= (uint64_t)(c & 0x7F) << shift;
        if (c < 0x80) {
            *v = r;
            return true;
        }
    }
    return false;
}

static bool pb_field(const unsigned char *&p, const unsigned char *end, uint64_t *field,
                     int *wire, uint64_t *value, const unsigned char **data, size_t *len)
{
    uint64_t tag = 0;
    if (!pb_varint(p, end, &tag)) return false;
    *field = tag >> 3;
    *wire = (int)(tag & 7);
    *value = 0;
    *data = nullptr;
    *len = 0;
    switch (*wire) {
    case 0:
        return pb_varint(p, end, value);
    case 1:
        if (end - p < 8) return false;
        p += 8;
        return true;
    case 2: {
        uint64_t n = 0;
        if (!pb_varint(p, end, &n) || n > (uint64_t)(end - p)) return false;
        *data = p;
        *len = (size_t)n;
        p += n;
        return true;
    }
    case 5:
        if (end - p < 4) return false;
        p += 4;
        return true;
    default:
        return false;
    }
}

static bool read_facts(const std::string &proto, model_facts *f)
{
    const unsigned char *p = reinterpret_cast<const unsigned char *>(proto.data());
    const unsigned char *end = p + proto.size();
    while (p < end) {
        uint64_t field = 0, v = 0;
        int wire = 0;
        const unsigned char *d = nullptr;
        size_t n = 0;
        if (!pb_field(p, end, &field, &wire, &v, &d, &n)) return false;
        if (wire != 2 || (field != 2 && field != 3)) continue;
        const unsigned char *q = d, *qend = d + n;
        while (q < qend) {
            uint64_t g = 0, gv = 0;
            int gw = 0;
            const unsigned char *gd = nullptr;
            size_t gn = 0;
            if (!pb_field(q, qend, &g, &gw, &gv, &gd, &gn)) return false;
            if (field == 2 && g == 3 && gw == 0) f->model_type = gv;
            if (field == 2 && g == 35 && gw == 0) f->byte_fallback = gv != 0;
            if (field == 3 && g == 2 && gw == 2) f->charsmap = gn > 0;
            if (field == 3 && g == 4 && gw == 0) f->remove_ws = gv != 0;
        }
    }
    return true;
}

/* Bytes of s with each U+2581 counted as 1 (*bytes), and its characters
 * (*chars: bytes that are not UTF-8 continuation bytes, so an invalid
 * sequence counts at most as many as sentencepiece's U+FFFDs for it).
 * With skip_spaces, ASCII spaces and U+2581 count for nothing: removing
 * extra whitespace drops spaces, and trailing U+2581s too (after escaping
 * they look the same). */
static void weigh(const char *s, size_t n, bool skip_spaces, size_t *bytes, size_t *chars)
{
    const unsigned char *u = reinterpret_cast<const unsigned char *>(s);
    size_t w = 0, c = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char b = u[i];
        if (b == ' ' && skip_spaces) continue;
        const bool lower_block = b == 0xE2 && i + 2 < n && u[i + 1] == 0x96 && u[i + 2] == 0x81;
        if (lower_block) {
            i += 2;
            if (skip_spaces) continue;
        }
        if (b < 0x80 || b > 0xBF) c++;
        w++;
    }
    *bytes = w;
    *chars = c;
}

/* Fill tok->max_piece and tok->drops_spaces (max_piece stays 0 when no
 * bound holds). */
static void compute_bound_unsafe(dol_tokenizer *tok)
{
    model_facts f;
    if (!read_facts(tok->sp.serialized_model_proto(), &f) || f.charsmap) return;
    tok->drops_spaces = f.remove_ws;
    size_t most = 1, most_chars = 1;
    for (int id = 0; id < tok->vocab; id++) {
        size_t w = 1, c = 1;
        if (tok->sp.IsControl(id)) continue;
        if (tok->sp.IsByte(id)) {
            w = c = 1;
        } else if (tok->sp.IsUnknown(id)) {
            /* With byte fallback an unknown character becomes byte pieces;
             * BPE and CHAR models give each unknown character its own
             * unknown piece; others may merge a run of them into one. */
            if (f.byte_fallback) continue;
            if (f.model_type != 2 && f.model_type != 4) return;
            w = 4;
            c = 1;
        } else {
            const std::string &piece = tok->sp.IdToPiece(id);
            weigh(piece.data(), piece.size(), false, &w, &c);
        }
        if (w > most) most = w;
        if (c > most_chars) most_chars = c;
    }
    if (most > (size_t)INT_MAX || most_chars > most) return;
    tok->max_piece = (int)most;
    tok->max_piece_chars = (int)most_chars;
}

static void compute_bound(dol_tokenizer *tok)
{
    tok->max_piece = tok->max_piece_chars = 0;
    try {
        compute_bound_unsafe(tok);
    } catch (...) {
        tok->max_piece = tok->max_piece_chars = 0;   /* no bound: prompts are encoded */
    }
}

extern "C" int dol_tokenizer_load(const char *path, dol_tokenizer **out,
                                  char *err, size_t errlen)
{
    if (out) *out = nullptr;
    if (!path || !out) {
        dol_set_err(err, errlen, "tokenizer: no path given");
        return -1;
    }
    dol_tokenizer *tok = nullptr;
    try {
        tok = new dol_tokenizer();
        const auto st = tok->sp.Load(path);
        if (!st.ok()) {
            dol_set_err(err, errlen, "%s: cannot load sentencepiece model: %s",
                        path, st.ToString().c_str());
            delete tok;
            return -1;
        }
        tok->vocab = tok->sp.GetPieceSize();
        if (tok->vocab <= 0) {
            dol_set_err(err, errlen, "%s: sentencepiece model has no pieces", path);
            delete tok;
            return -1;
        }
        compute_bound(tok);
    } catch (const std::exception &e) {
        dol_set_err(err, errlen, "%s: cannot load sentencepiece model: %s", path,
                    e.what());
        delete tok;
        return -1;
    } catch (...) {
        dol_set_err(err, errlen, "%s: cannot load sentencepiece model: unknown error",
                    path);
        delete tok;
        return -1;
    }
    *out = tok;
    return 0;
}

extern "C" void dol_tokenizer_free(dol_tokenizer *tok)
{
    try {
        delete tok;
    } catch (...) {
    }
}

extern "C" int dol_tokenizer_vocab_size(const dol_tokenizer *tok)
{
    return tok ? tok->vocab : 0;
}

extern "C" int dol_tokenizer_max_piece_bytes(const dol_tokenizer *tok)
{
    return tok ? tok->max_piece : 0;
}

extern "C" size_t dol_tokenizer_min_tokens(const dol_tokenizer *tok, const char *text,
                                          size_t len)
{
    if (!tok || tok->max_piece <= 0 || tok->max_piece_chars <= 0 || !text) return 0;
    size_t w = 0, c = 0;
    weigh(text, len, tok->drops_spaces, &w, &c);
    const size_t lb = (size_t)tok->max_piece, lc = (size_t)tok->max_piece_chars;
    const size_t by_bytes = w / lb + (w % lb != 0), by_chars = c / lc + (c % lc != 0);
    return by_bytes > by_chars ? by_bytes : by_chars;
}

extern "C" int32_t dol_tokenizer_bos_id(const dol_tokenizer *tok)
{
    try {
        return tok ? tok->sp.bos_id() : -1;
    } catch (...) {
        return -1;
    }
}

extern "C" int32_t dol_tokenizer_eos_id(const dol_tokenizer *tok)
{
    try {
        return tok ? tok->sp.eos_id() : -1;
    } catch (...) {
        return -1;
    }
}

extern "C" int dol_tokenizer_encode(const dol_tokenizer *tok, const char *text,
                                    size_t len, bool add_bos, int32_t **ids,
                                    size_t *n, char *err, size_t errlen)
{
    if (ids) *ids = nullptr;
    if (n) *n = 0;
    if (!tok || !ids || !n || (!text && len)) {
        dol_set_err(err, errlen, "tokenizer: encode: invalid arguments");
        return -1;
    }
    try {
        std::vector<int> v;
        const auto st = tok->sp.Encode(std::string_view(text ? text : "", len), &v);
        if (!st.ok()) {
            dol_set_err(err, errlen, "tokenizer: encode failed: %s",
                        st.ToString().c_str());
            return -1;
        }
        const bool bos = add_bos && tok->sp.bos_id() >= 0;
        const size_t total = v.size() + (bos ? 1 : 0);
        int32_t *buf = static_cast<int32_t *>(malloc((total ? total : 1) * sizeof *buf));
        if (!buf) {
            dol_set_err(err, errlen, "tokenizer: encode: out of memory");
            return -1;
        }
        size_t k = 0;
        if (bos) buf[k++] = tok->sp.bos_id();
        for (int id : v) buf[k++] = id;
        *ids = buf;
        *n = total;
        return 0;
    } catch (const std::exception &e) {
        dol_set_err(err, errlen, "tokenizer: encode failed: %s", e.what());
    } catch (...) {
        dol_set_err(err, errlen, "tokenizer: encode failed: unknown error");
    }
    return -1;
}

extern "C" int dol_tokenizer_encode_spans(const dol_tokenizer *tok, const char *text,
                                          size_t len, int32_t **ids, size_t **begin,
                                          size_t *n, char *err, size_t errlen)
{
    if (ids) *ids = nullptr;
    if (begin) *begin = nullptr;
    if (n) *n = 0;
    if (!tok || !ids || !begin || !n || (!text && len)) {
        dol_set_err(err, errlen, "tokenizer: encode: invalid arguments");
        return -1;
    }
    try {
        const auto spt = tok->sp.EncodeAsImmutableProto(std::string_view(text ? text : "", len));
        const size_t total = spt.pieces_size();
        int32_t *v = static_cast<int32_t *>(malloc((total ? total : 1) * sizeof *v));
        size_t *b = static_cast<size_t *>(malloc((total ? total : 1) * sizeof *b));
        if (!v || !b) {
            free(v);
            free(b);
            dol_set_err(err, errlen, "tokenizer: encode: out of memory");
            return -1;
        }
        for (size_t i = 0; i < total; i++) {
            const auto piece = spt.pieces(static_cast<int>(i));
            v[i] = static_cast<int32_t>(piece.id());
            b[i] = piece.begin() < len ? piece.begin() : len;
        }
        *ids = v;
        *begin = b;
        *n = total;
        return 0;
    } catch (const std::exception &e) {
        dol_set_err(err, errlen, "tokenizer: encode failed: %s", e.what());
    } catch (...) {
        dol_set_err(err, errlen, "tokenizer: encode failed: unknown error");
    }
    return -1;
}

extern "C" int dol_tokenizer_decode(const dol_tokenizer *tok, const int32_t *ids,
                                    size_t n, char **text, size_t *len,
                                    char *err, size_t errlen)
{
    if (text) *text = nullptr;
    if (len) *len = 0;
    if (!tok || !text || !len || (!ids && n)) {
        dol_set_err(err, errlen, "tokenizer: decode: invalid arguments");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!in_range(tok, ids[i])) {
            dol_set_err(err, errlen,
                        "tokenizer: decode: token id %ld at position %zu is outside "
                        "the vocabulary [0, %d)",
                        (long)ids[i], i, tok->vocab);
            return -1;
        }
    }
    try {
        const std::vector<int> v(ids, ids + n);
        std::string s;
        const auto st = tok->sp.Decode(v, &s);
        if (!st.ok()) {
            dol_set_err(err, errlen, "tokenizer: decode failed: %s",
                        st.ToString().c_str());
            return -1;
        }
        char *buf = static_cast<char *>(malloc(s.size() + 1));
        if (!buf) {
            dol_set_err(err, errlen, "tokenizer: decode: out of memory");
            return -1;
        }
        memcpy(buf, s.data(), s.size());
        buf[s.size()] = '\0';
        *text = buf;
        *len = s.size();
        return 0;
    } catch (const std::exception &e) {
        dol_set_err(err, errlen, "tokenizer: decode failed: %s", e.what());
    } catch (...) {
        dol_set_err(err, errlen, "tokenizer: decode failed: unknown error");
    }
    return -1;
}

extern "C" const char *dol_tokenizer_id_to_piece(const dol_tokenizer *tok, int32_t id)
{
    if (!in_range(tok, id)) return nullptr;
    try {
        return tok->sp.IdToPiece(id).c_str();
    } catch (...) {
        return nullptr;
    }
}

extern "C" int32_t dol_tokenizer_piece_to_id(const dol_tokenizer *tok,
                                             const char *piece)
{
    if (!tok || !piece) return -1;
    try {
        /* sentencepiece answers unk_id for unknown pieces; tell the real
         * "<unk>" piece apart from a miss. */
        const int id = tok->sp.PieceToId(piece);
        if (!in_range(tok, id)) return -1;
        if (tok->sp.IdToPiece(id) != piece) return -1;
        return id;
    } catch (...) {
        return -1;
    }
}

extern "C" bool dol_tokenizer_is_control(const dol_tokenizer *tok, int32_t id)
{
    if (!in_range(tok, id)) return false;
    try {
        return tok->sp.IsControl(id);
    } catch (...) {
        return false;
    }
}

extern "C" bool dol_tokenizer_is_byte(const dol_tokenizer *tok, int32_t id)
{
    if (!in_range(tok, id)) return false;
    try {
        return tok->sp.IsByte(id);
    } catch (...) {
        return false;
    }
}
