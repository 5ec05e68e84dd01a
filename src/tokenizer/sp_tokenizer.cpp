/* src/tokenizer/sp_tokenizer.cpp — the tokenizer half of
 * include/dolphin/tokenizer.h: a thin extern "C" wrapper over
 * libsentencepiece (load, encode, decode, vocabulary queries). This is the
 * only C++ in Dolphin; it holds no logic of its own beyond range checks and
 * copying results into malloc'd buffers. No exception ever leaves this file:
 * every entry point catches everything and reports through err (or a
 * neutral return value where the API has no err). */
#include "dolphin/tokenizer.h"

#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

struct dol_tokenizer {
    sentencepiece::SentencePieceProcessor sp;
    int vocab = 0;
};

static bool in_range(const dol_tokenizer *tok, int32_t id)
{
    return tok && id >= 0 && id < tok->vocab;
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
