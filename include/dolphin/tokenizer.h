/* include/dolphin/tokenizer.h — Llama's sentencepiece tokenizer behind a C
 * API (the implementation in src/tokenizer/sp_tokenizer.cpp is the only C++
 * in Dolphin), and an incremental detokenizer for streaming.
 *
 * Text in a prompt that looks like a control token ("<s>", "</s>") is encoded
 * as literal text; BOS is only ever added by `add_bos`. Token ids are int32.
 */
#ifndef DOLPHIN_TOKENIZER_H
#define DOLPHIN_TOKENIZER_H

#include "dolphin/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dol_tokenizer dol_tokenizer;

/* Load a sentencepiece model file (tokenizer.model). On failure -1 and one
 * line in err naming the file. Caller frees with dol_tokenizer_free. */
int dol_tokenizer_load(const char *path, dol_tokenizer **out,
                       char *err, size_t errlen);
void dol_tokenizer_free(dol_tokenizer *tok);

/* A SentencePiece vocabulary given as arrays, as a GGUF file carries it
 * (tokenizer.ggml.tokens / scores / token_type and the special ids), for
 * dol_tokenizer_from_spec. The arrays are only read during that call. */
typedef struct {
    int32_t n_pieces;
    const char *const *piece;      /* n_pieces pieces, UTF-8, piece_len[i] bytes each */
    const size_t *piece_len;       /* (no NUL needed) */
    const float *score;            /* merge priority: the higher, the earlier */
    const int32_t *type;           /* sentencepiece's piece types: 1 normal, 2 unknown,
                                    * 3 control, 4 user defined, 5 unused, 6 byte */
    int32_t unk_id, bos_id, eos_id, pad_id;   /* -1: none */
    bool add_dummy_prefix;         /* a "▁" before the text (Llama: true) */
    bool remove_extra_whitespaces; /* (Llama: false) */
    const char *source;            /* the origin, first in every message (the file) */
} dol_tokenizer_spec;

/* Build a tokenizer from `spec` with the sentencepiece library: a ModelProto
 * is serialized from the arrays (a BPE model, byte fallback when any piece
 * has the byte type, an identity normalizer with the two settings above;
 * libprotobuf-lite, src/tokenizer/spm_model.proto) and loaded with
 * LoadFromSerializedProto, which checks it as it checks a tokenizer.model
 * file (one unknown piece, byte pieces named <0xXX>, no duplicates ...).
 * 0 and *out (caller frees with dol_tokenizer_free), or -1 with one line in
 * err starting with spec->source. Any thread. */
int dol_tokenizer_from_spec(const dol_tokenizer_spec *spec, dol_tokenizer **out,
                            char *err, size_t errlen);

int dol_tokenizer_vocab_size(const dol_tokenizer *tok);
int32_t dol_tokenizer_bos_id(const dol_tokenizer *tok);
int32_t dol_tokenizer_eos_id(const dol_tokenizer *tok);

/* Encode `len` bytes of UTF-8 text. With add_bos the BOS id is prepended.
 * *ids is malloc'd (caller frees; non-NULL even when *n == 0).
 * Returns 0, or -1 with err set (e.g. allocation failure). Invalid UTF-8 in
 * the input is encoded the way sentencepiece does (replacement character). */
int dol_tokenizer_encode(const dol_tokenizer *tok, const char *text, size_t len,
                         bool add_bos, int32_t **ids, size_t *n,
                         char *err, size_t errlen);

/* Encode like dol_tokenizer_encode without BOS, and give where each piece
 * begins in the input: (*begin)[i] is the byte offset in text of the first
 * input byte piece i stands for (the start of sentencepiece's span of the
 * piece; the byte-fallback pieces of one character all begin where the
 * character does, and whitespace the normalizer removes between two pieces
 * lies in the second's span). Both arrays
 * are malloc'd (caller frees; non-NULL even when *n == 0). 0 or -1. */
int dol_tokenizer_encode_spans(const dol_tokenizer *tok, const char *text, size_t len,
                               int32_t **ids, size_t **begin, size_t *n,
                               char *err, size_t errlen);

/* Decode ids to UTF-8 text exactly as sentencepiece's DecodeIds does
 * (control tokens such as BOS/EOS produce nothing; byte-fallback pieces are
 * joined into characters; the leading space of the first word is dropped).
 * *text is malloc'd and NUL-terminated; *len excludes the NUL.
 * Ids outside [0, vocab) are an error (-1). */
int dol_tokenizer_decode(const dol_tokenizer *tok, const int32_t *ids, size_t n,
                         char **text, size_t *len, char *err, size_t errlen);

/* Piece string of an id ("▁Hello", "<0x0A>"), or NULL when out of range.
 * The pointer is owned by the tokenizer and valid until it is freed. */
const char *dol_tokenizer_id_to_piece(const dol_tokenizer *tok, int32_t id);
/* Id of a piece, or -1 when the piece is not in the vocabulary. */
int32_t dol_tokenizer_piece_to_id(const dol_tokenizer *tok, const char *piece);
/* True for control tokens (BOS, EOS, ...). */
bool dol_tokenizer_is_control(const dol_tokenizer *tok, int32_t id);
/* True for byte-fallback tokens ("<0x00>".."<0xFF>"): each stands for the
 * single byte written in hex in its piece. False when out of range. */
bool dol_tokenizer_is_byte(const dol_tokenizer *tok, int32_t id);

/* The most text one token of an encoding can stand for, in "weight": bytes
 * of UTF-8 text, except that U+2581 ("▁", which sentencepiece writes for a
 * space) counts as 1, like the space it stands for. It is the largest
 * weight of a piece that encoding can produce: byte-fallback pieces
 * ("<0x41>") count 1, control pieces none, the unknown piece one character
 * (4) where it covers one. Every token of dol_tokenizer_encode's output
 * then covers at most this much of the text, so the text's weight divided
 * by it is a lower bound on the number of tokens (see
 * dol_tokenizer_min_tokens). 0 when the model admits no such bound: its
 * normalizer rewrites text (NFKC and the like can shrink it), or the
 * unknown piece can cover a run of characters (unigram or word models
 * without byte fallback). Computed once, when the tokenizer is loaded. */
int dol_tokenizer_max_piece_bytes(const dol_tokenizer *tok);

/* A lower bound on the number of ids dol_tokenizer_encode(text, len,
 * add_bos = false) returns, computed in one pass over the bytes without
 * encoding: ceil(weight / dol_tokenizer_max_piece_bytes), where weight
 * counts every byte but U+2581 as 1 each (U+2581 as 1 in all) and leaves
 * out ASCII spaces and U+2581 when the model removes extra whitespace (they
 * may all vanish); or, when larger, the same bound counted in characters (the
 * text's characters over the most characters in a piece: 16 against 27
 * bytes for Llama-2, which makes it the tighter one for ASCII text). 0 when
 * max_piece_bytes is 0 (no bound known). Lets a server refuse a prompt that
 * can never fit in the context without spending the time to encode it. */
size_t dol_tokenizer_min_tokens(const dol_tokenizer *tok, const char *text, size_t len);

/* Incremental detokenizer: turns generated ids into text chunks whose
 * concatenation equals decode(prompt + generated) - decode(prompt), each chunk
 * holding whole UTF-8 characters only (bytes of a character spread over
 * byte-fallback tokens are held back until complete; bytes that can never
 * form a valid character are replaced by U+FFFD). The leading space of the
 * first generated word is kept when the prompt has text before it and
 * dropped when it does not (empty prompt / BOS only).
 *
 * Usage: dol_detok_new(), then dol_detok_push() per generated id, then
 * dol_detok_finish() once at the end; dol_detok_free() releases it. */
typedef struct dol_detok dol_detok;

/* prompt_ids: the prompt as sent to the model (BOS included or not);
 * only its last few tokens are kept as context. Returns NULL on OOM.
 * Also NULL when a prompt id is outside the vocabulary. When the prompt ends
 * inside a character spread over byte-fallback tokens and the generated
 * bytes complete it, the whole completed character is emitted; otherwise
 * the U+FFFDs of those prompt bytes belong to decode(prompt), not to the
 * output. */
dol_detok *dol_detok_new(const dol_tokenizer *tok, const int32_t *prompt_ids,
                         size_t n_prompt);
void dol_detok_free(dol_detok *d);

/* Feed one generated id. Appends the newly complete text to *out (a buffer
 * the caller owns, grown with realloc; *out_len / *out_cap track it; *out is
 * always NUL-terminated). Returns the number of bytes appended (>= 0), or -1
 * on error (id out of range, OOM). */
int dol_detok_push(dol_detok *d, int32_t id, char **out, size_t *out_len,
                   size_t *out_cap);
/* End of generation: append whatever is still held back, with incomplete
 * UTF-8 sequences replaced by U+FFFD. Returns bytes appended or -1. */
int dol_detok_finish(dol_detok *d, char **out, size_t *out_len, size_t *out_cap);

#ifdef __cplusplus
}
#endif
#endif
