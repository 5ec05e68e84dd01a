/* include/dolphin/grammar.h — constrained decoding (docs/api.md, "Structured
 * output"): JSON, or JSON restricted by a JSON Schema subset, enforced token
 * by token.
 *
 * A dol_grammar is the compiled form of a response_format: a pushdown
 * automaton over bytes whose stack frames are JSON containers and scalars
 * (an object expecting its next key, a string counting its characters, an
 * integer checking its bounds...). It is immutable once compiled and shared
 * by reference count, so any thread may hold one. Compiling happens when a
 * request is parsed, so that an unsupported or oversized schema is a 400
 * before the request is queued.
 *
 * A dol_grammar_vocab is built once per tokenizer: a trie over the byte
 * strings of the vocabulary (sentencepiece's U+2581 read as a space,
 * byte-fallback pieces as their one byte, control pieces left out), plus a
 * cache of token masks keyed by the top stack frame. A dol_matcher is one
 * sequence's position in a grammar. Vocab and matchers belong to the
 * thread that samples (the scheduler's); they are not thread-safe.
 */
#ifndef DOLPHIN_GRAMMAR_H
#define DOLPHIN_GRAMMAR_H

#include "dolphin/common.h"
#include "dolphin/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Default of max_grammar_states: the most automaton states (nodes of the
 * compiled schema plus the bytes of its enum/const literals and property
 * names) a schema may compile to. */
#define DOL_GRAMMAR_MAX_STATES 20000

typedef struct dol_grammar dol_grammar;

/* The grammar of any JSON object (response_format json_object), with
 * whitespace between tokens bounded. Returns a new reference (one shared
 * instance), or NULL on OOM. */
dol_grammar *dol_grammar_json_object(void);

/* Compile a JSON Schema given as JSON text (len bytes) into a grammar.
 * max_states <= 0 means DOL_GRAMMAR_MAX_STATES. Identical schema texts share
 * one compiled grammar (a small cache), so repeated requests reuse its mask
 * cache. On success 0 and *out holds a new reference. On failure -1: `msg`
 * says why in one line, naming the keyword and its JSON pointer inside the
 * schema when a keyword is unsupported ("'pattern' at /properties/a is not
 * supported"); `oom` is set when the failure was memory, not the schema. */
int dol_grammar_from_schema(const char *schema, size_t len, int max_states,
                            dol_grammar **out, char *msg, size_t msglen, bool *oom);

void dol_grammar_retain(dol_grammar *g);
void dol_grammar_release(dol_grammar *g);
/* States counted against max_grammar_states. */
int dol_grammar_n_states(const dol_grammar *g);

typedef struct dol_grammar_vocab dol_grammar_vocab;

/* The vocabulary trie of tok, over ids [0, vocab). NULL on OOM. */
dol_grammar_vocab *dol_grammar_vocab_new(const dol_tokenizer *tok, int vocab);
void dol_grammar_vocab_free(dol_grammar_vocab *v);
/* Words of a mask: ceil(vocab / 64). */
int dol_grammar_mask_words(const dol_grammar_vocab *v);

typedef struct dol_matcher dol_matcher;

/* A matcher at the start of g (takes its own reference). NULL on OOM. */
dol_matcher *dol_matcher_new(dol_grammar *g);
void dol_matcher_free(dol_matcher *m);

/* The tokens allowed next: bit (id % 64) of mask[id / 64] is set when token
 * id may follow (mask has dol_grammar_mask_words(v) words). The EOS id's bit
 * is set exactly when the value so far is complete. Values nest at most
 * 511 levels (docs/api.md); near that bound only bytes after which the value
 * can still close in time are allowed, so the mask of an incomplete value
 * is never empty. The result depends on the matcher's state only (never on
 * other sequences or the cache). */
void dol_matcher_mask(dol_matcher *m, dol_grammar_vocab *v, uint64_t *mask);
/* Advance by token id (not EOS). False when the token is not allowed (the
 * state is then unchanged) or on OOM. */
bool dol_matcher_accept(dol_matcher *m, const dol_grammar_vocab *v, int32_t id);
/* Advance by raw bytes (tests, benchmarks). False when not allowed. */
bool dol_matcher_accept_bytes(dol_matcher *m, const char *s, size_t n);
/* True when what was accepted so far is a complete value. */
bool dol_matcher_complete(const dol_matcher *m);

#ifdef __cplusplus
}
#endif
#endif
