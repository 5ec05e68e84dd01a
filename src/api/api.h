/* src/api/api.h — private to the HTTP front end: the OpenAI-compatible API's
 * request parsing and validation, and response JSON building (docs/api.md).
 * Pure functions over cJSON values: no sockets, no threads, no scheduler
 * calls, so each can be unit-tested on its own. src/http/ does the plumbing.
 */
#ifndef DOLPHIN_API_H
#define DOLPHIN_API_H

#include <cjson/cJSON.h>

#include "dolphin/common.h"
#include "dolphin/grammar.h"
#include "dolphin/scheduler.h"
#include "dolphin/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---------------------------------------------------------- */

/* One OpenAI-shaped error: {"error":{"message","type","param","code"}}. */
typedef struct {
    int status;          /* HTTP status (400, 401, ...) */
    char type[48];       /* "invalid_request_error", ... */
    char param[64];      /* field at fault; "" = null */
    char code[48];       /* machine-readable code; "" = null */
    char message[512];
} dol_api_error;

void dol_api_error_set(dol_api_error *e, int status, const char *type,
                       const char *param, const char *code,
                       const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* 400 invalid_request_error naming `param` (may be NULL). */
void dol_api_error_invalid(dol_api_error *e, const char *param,
                           const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The error's JSON body, malloc'd (NULL on OOM). */
char *dol_api_error_json(const dol_api_error *e);

/* The errors that several layers give, each worded in one place: */
/* 500 internal_error "Out of memory."; returns -1 (for `return oom`). */
int dol_api_error_oom(dol_api_error *e);
/* 503 server_draining: the server is shutting down. */
void dol_api_error_draining(dol_api_error *e);
/* 503 model_loading: no model is loaded to serve the request yet. */
void dol_api_error_not_loaded(dol_api_error *e);
/* 504 timeout_error request_timeout; while_doing (may be NULL) says what was
 * still going on, e.g. "model 'x' was still loading". */
void dol_api_error_timeout(dol_api_error *e, double timeout_s, const char *while_doing);
/* What a client sees for a scheduler reason (include/dolphin/scheduler.h):
 * status, type, code, param and message, with the figures of `in`. param:
 * the prompt's field ("prompt" or "messages"; NULL = "prompt").
 *   QUEUE_FULL 429 rate_limit_exceeded; DRAINING 503 server_draining;
 *   CONTEXT_OVERFLOW, KV_OVERFLOW 400 context_length_exceeded;
 *   BAD_TOKEN, TOO_MANY_CHOICES, INVALID 400 invalid_request_error;
 *   TIMED_OUT 504 timeout_error; CANCELLED 499 (never sent: the client is
 *   gone); NO_MEMORY, BACKEND_FAILURE, GRAMMAR_BROKEN 500. */
void dol_api_error_from_reason(dol_api_error *e, const dol_reason_info *in, const char *param);
/* The same for a refusal judged from a lower bound on the prompt's tokens
 * (in->n_prompt), before tokenizing: the message says so. */
void dol_api_error_prompt_too_long(dol_api_error *e, const dol_reason_info *in,
                                   const char *param);

/* ---- request bodies -------------------------------------------------- */

/* Strict UTF-8 check: no overlong forms, surrogates or code points past
 * U+10FFFF. */
bool dol_api_utf8_valid(const char *s, size_t n);

/* Parse a request body that must be one JSON object: non-empty, valid UTF-8,
 * no NUL bytes or \u0000 escapes, objects and arrays nested at most
 * max_depth deep (the body's object is depth 1; checked on the raw bytes
 * before parsing; 0 = only cJSON's own limit, CJSON_NESTING_LIMIT), nothing
 * after the value, no key twice in one object. Returns the object (caller
 * frees with cJSON_Delete) or NULL with a 400 in e (500 on OOM). */
cJSON *dol_api_parse_object(const char *body, size_t len, int max_depth,
                            dol_api_error *e);
/* Deepest nesting of objects and arrays in a JSON text, counted on the raw
 * bytes (brackets inside strings, escaped quotes included, do not count);
 * stops counting once it passes `stop` (returns stop + 1). Meaningful for
 * valid JSON; for invalid JSON it is whatever the brackets say. */
int dol_api_json_depth(const char *s, size_t n, int stop);

/* True when a Content-Type header value names application/json (parameters
 * such as "; charset=utf-8" are allowed; NULL = absent = accepted). */
bool dol_api_content_type_is_json(const char *ct);

/* ---- POST /v1/completions ---------------------------------------------- */

#define DOL_API_MAX_PROMPTS 64   /* prompts in one request */
#define DOL_API_MAX_N 16         /* choices per prompt (default of max_n) */
#define DOL_API_MAX_STOP_LEN 512 /* bytes per stop string (default of max_stop_len) */
#define DOL_API_JSON_DEPTH 64    /* nesting of a request body (max_json_depth) */

/* One prompt as the client sent it: text, or token ids taken as given. */
typedef struct {
    char *text;          /* malloc'd, NUL-terminated; NULL for token prompts */
    size_t text_len;
    int32_t *ids;        /* malloc'd; NULL for text prompts */
    int n_ids;
} dol_api_prompt;

/* What validation needs to know about the served model, the defaults and
 * the configured limits (dol_config's max_* settings). A limit left 0 takes
 * its built-in default; max_stop and max_logit_bias are also capped at the
 * sizes of the arrays that hold them (DOL_MAX_STOP, DOL_MAX_LOGIT_BIAS). */
typedef struct {
    int vocab_size;          /* token ids must be in [0, vocab_size) */
    int context_len;         /* the model's context (max_prompt_tokens at or
                                above it is no limit of its own) */
    int default_max_tokens;  /* when max_tokens is absent or null */
    float default_temperature;
    float default_top_p;
    int default_top_k;
    int max_prompt_tokens;   /* tokens in one prompt; 0 = context_len */
    int max_tokens_cap;      /* largest max_tokens; 0 = only the context */
    int max_n;               /* choices per prompt; 0 = DOL_API_MAX_N */
    int max_stop;            /* stop strings; 0 = DOL_MAX_STOP */
    int max_stop_len;        /* bytes per stop string; 0 = DOL_API_MAX_STOP_LEN */
    int max_logit_bias;      /* logit_bias entries; 0 = DOL_MAX_LOGIT_BIAS */
    int max_grammar_states;  /* response_format schema automaton; 0 = DOL_GRAMMAR_MAX_STATES */
} dol_api_limits;

/* ---- POST /v1/chat/completions: messages and the Llama-2 chat format ---- */

#define DOL_API_MAX_MESSAGES 4096

typedef enum {
    DOL_CHAT_SYSTEM = 0,     /* "system" (or OpenAI's newer name "developer") */
    DOL_CHAT_USER,
    DOL_CHAT_ASSISTANT,
} dol_chat_role;

typedef struct {
    dol_chat_role role;
    char *content;           /* malloc'd, NUL-terminated */
    size_t len;
} dol_chat_message;

/* Validate a "messages" array: each element an object with a role (system,
 * developer, user, assistant) and a content that is a string or an array of
 * {"type":"text","text":...} parts (joined with "\n"; null only for an
 * assistant). Role order is checked by dol_api_chat_prompt_ids. 400 naming
 * the field (e.g. "messages[2].content") on failure. */
int dol_api_parse_messages(const cJSON *v, dol_chat_message **out, int *n,
                           dol_api_error *e);
void dol_api_messages_free(dol_chat_message *m, int n);

/* The prompt token ids of a conversation in Llama-2's chat format, built the
 * way Meta's reference chat_completion builds them: a leading system message
 * is merged into the first user message as "<<SYS>>\n{system}\n<</SYS>>\n\n
 * {user}"; the roles must then alternate user/assistant and end with user
 * (else 400 naming "messages"); each finished pair is encoded on its own as
 * "[INST] {user} [/INST] {answer} " (contents stripped of surrounding
 * whitespace as Python's str.strip does) between a BOS id and an EOS id; the
 * last user turn as "[INST] {user} [/INST]" after a BOS id. Text that looks
 * like a special token stays literal text. *ids is malloc'd. */
int dol_api_chat_prompt_ids(const dol_tokenizer *tok, const dol_chat_message *m,
                            int n, int32_t **ids, int *n_ids, dol_api_error *e);
/* A lower bound on the n_ids dol_api_chat_prompt_ids would return, without
 * encoding: the same turns, each bounded by dol_tokenizer_min_tokens, plus
 * their BOS/EOS ids. Checks the role order the same way (400). */
int dol_api_chat_min_tokens(const dol_tokenizer *tok, const dol_chat_message *m,
                            int n, int64_t *min_ids, dol_api_error *e);

/* A validated /v1/completions or /v1/chat/completions request. */
typedef struct {
    bool chat;               /* parsed by dol_api_parse_chat */
    char *model;             /* as sent, or NULL when absent */
    dol_api_prompt *prompts; /* completions: n_prompts >= 1 */
    int n_prompts;
    dol_chat_message *messages; /* chat: n_messages >= 1 */
    int n_messages;
    int64_t max_tokens;      /* >= 0 */
    bool max_tokens_given;
    int n;                   /* choices per prompt, 1..max_n */
    dol_sampling_params sampling;
    bool has_seed;
    uint64_t seed;
    char *stop[DOL_MAX_STOP];
    int n_stop;
    bool stream;
    bool include_usage;      /* stream_options.include_usage */
    int logprobs;            /* -1 = off, else 0..DOL_MAX_LOGPROBS (chat:
                                logprobs true -> top_logprobs, default 0) */
    bool echo;
    bool ignore_eos;
    bool no_speculation;     /* "speculative": false (default true: the
                                server's setting applies) */
    bool return_token_ids;   /* vLLM's extension: token ids in the response */
    dol_grammar *grammar;    /* response_format json_object / json_schema (a
                                reference, released by ..._params_free); NULL = text */
} dol_completion_params;

/* Validate every known field of a /v1/completions body (unknown fields are
 * ignored). On failure returns -1 with a 400 naming the field in e; p is
 * left freeable either way. */
int dol_api_parse_completion(const cJSON *body, const dol_api_limits *lim,
                             dol_completion_params *p, dol_api_error *e);
/* The same for a /v1/chat/completions body (messages, max_tokens or
 * max_completion_tokens, logprobs as a boolean plus top_logprobs). When no
 * max_tokens is given, max_tokens_given is false: generation runs until EOS
 * or the end of the context. Fields that would change the result but are
 * not supported (tools, functions) are refused by name. Both parsers take
 * response_format (text, json_object, json_schema: the schema is compiled
 * here, so an unsupported or oversized one is a 400 naming
 * "response_format"). */
int dol_api_parse_chat(const cJSON *body, const dol_api_limits *lim,
                       dol_completion_params *p, dol_api_error *e);
void dol_api_completion_params_free(dol_completion_params *p);

/* 400 context_length_exceeded naming `param` ("prompt" or "messages") and
 * max_prompt_tokens when lim->max_prompt_tokens is set below the context and
 * the prompt has more tokens than it. Whether a prompt fits the context and
 * the KV cache is the scheduler's to say (dol_scheduler_fit). */
int dol_api_check_prompt_tokens(int64_t n_prompt, const dol_api_limits *lim,
                                const char *param, dol_api_error *e);
/* The same check before tokenizing, from a lower bound on the prompt's
 * tokens (dol_tokenizer_min_tokens, plus BOS): lets the server refuse a
 * prompt that can never pass without spending seconds encoding it. */
int dol_api_check_prompt_bound(int64_t min_prompt, const dol_api_limits *lim,
                               const char *param, dol_api_error *e);

/* ---- responses --------------------------------------------------------- */

/* Identity of one completion response (shared by all its stream chunks). */
typedef struct {
    const char *id;          /* "cmpl-..." or "chatcmpl-..." */
    const char *model;
    int64_t created;         /* unix seconds */
    const int32_t *prompt_ids; /* chat: top-level "prompt_token_ids" when
                                  non-NULL (return_token_ids) */
    int n_prompt_ids;
} dol_api_meta;

/* One choice as it goes into a response or a stream chunk. */
typedef struct {
    int index;
    const char *text;        /* not necessarily NUL-terminated */
    size_t text_len;
    const char *finish;      /* "stop" | "length" | NULL (null) */
    cJSON *logprobs;         /* taken over; NULL = null */
    const int32_t *token_ids;/* "token_ids" when non-NULL (return_token_ids) */
    int n_token_ids;
    const int32_t *prompt_ids; /* completions: "prompt_token_ids" when non-NULL */
    int n_prompt_ids;
    bool role;               /* chat chunks: the delta carries the role */
} dol_api_choice;

/* Usage figures; prompt_tokens < 0 leaves "usage" out. cached_tokens: the
 * prompt tokens whose K/V came from the prefix cache, given as
 * usage.prompt_tokens_details.cached_tokens as OpenAI does. */
typedef struct {
    int64_t prompt_tokens, completion_tokens, cached_tokens;
} dol_api_usage;

/* Add "usage" (prompt, completion and total tokens, prompt_tokens_details)
 * to root; nothing when usage is NULL or prompt_tokens < 0. 0, or -1 on OOM. */
int dol_api_add_usage(cJSON *root, const dol_api_usage *usage);

/* {"id","object":"text_completion","created","model","choices":[...],
 * "usage"?}. Takes over each choice's logprobs. NULL on OOM. */
cJSON *dol_api_completion_json(const dol_api_meta *m, dol_api_choice *ch,
                               int n_choices, const dol_api_usage *usage);

/* {"id","object":"chat.completion","created","model","choices":[{"index",
 * "message":{"role":"assistant","content"},"logprobs","finish_reason"}],
 * "usage"?}. Takes over each choice's logprobs. NULL on OOM. */
cJSON *dol_api_chat_json(const dol_api_meta *m, dol_api_choice *ch,
                         int n_choices, const dol_api_usage *usage);
/* One chat.completion.chunk: each choice's delta carries "role" when
 * ch.role, "content" when ch.text is non-NULL; usage (choices: []) when
 * given. Takes over each choice's logprobs. NULL on OOM. */
cJSON *dol_api_chat_chunk_json(const dol_api_meta *m, dol_api_choice *ch,
                               int n_choices, const dol_api_usage *usage);
/* Chat logprobs: {"content":[{"token","logprob","bytes","top_logprobs":
 * [{"token","logprob","bytes"}]}]} over n entries. */
cJSON *dol_api_chat_logprobs_json(const dol_tokenizer *tok,
                                  const dol_token_logprob *lps, int n);

/* A JSON string from n bytes of text. The text is meant to be valid UTF-8
 * already; should a byte slip through that is not, it becomes U+FFFD so the
 * JSON stays valid. So does a NUL byte (the model can generate one), which
 * would otherwise end the string early. NULL on OOM. */
cJSON *dol_api_string_n(const char *s, size_t n);
/* A JSON array of token ids. NULL on OOM. */
cJSON *dol_api_ids_json(const int32_t *ids, int n);

/* Server-Sent Event framing: "data: <json>\n\n" (takes over j and frees it),
 * or "data: [DONE]\n\n" when j is NULL. malloc'd; NULL on OOM. */
char *dol_api_sse_event(cJSON *j, size_t *len);

/* Text of one token for logprobs: the piece with "▁" as a space, "" for
 * control tokens, the byte itself for ASCII byte-fallback tokens and
 * "bytes:\xNN" for the others. Writes into buf (NUL-terminated). */
const char *dol_api_token_text(const dol_tokenizer *tok, int32_t id,
                               char *buf, size_t n);

/* OpenAI legacy completions logprobs object:
 * {"tokens":[...],"token_logprobs":[...],"top_logprobs":[{..}],
 *  "text_offset":[...]} over n entries. Entries with n_top < 0 (the first
 * echoed prompt token) get null logprob and null top_logprobs.
 * offsets[i] is the byte offset of token i in the choice's text. */
cJSON *dol_api_logprobs_json(const dol_tokenizer *tok,
                             const dol_token_logprob *lps, const int *offsets,
                             int n);
/* The same for entries that may start the token sequence: when at_start
 * (only control tokens, if any, come before them), the first entry that is
 * not a control token, and its alternatives, read without the leading space
 * that sentencepiece drops from the first piece it decodes, as the text does.
 * With text (NULL: the pieces), the generated text, text_len bytes, that
 * begins at offset base of the choice's text: tokens[i] reads text from
 * offsets[i] to offsets[i + 1] (the last: to end), less base and clamped to
 * text, so a token that a stop string cut reads only what the choice kept.
 * Joined, the tokens then spell the text (byte-fallback tokens of non-ASCII
 * characters aside). */
cJSON *dol_api_logprobs_json_at(const dol_tokenizer *tok, const dol_token_logprob *lps,
                                const int *offsets, int n, bool at_start, const char *text,
                                size_t text_len, int base, int end);
/* Logprobs of an echoed prompt ids[0..n) (lps: n entries; NULL gives the
 * empty object) whose text in the choice is echo (echo_len bytes): the text
 * prompt as given, or the decode of a token prompt. The tokens, joined, spell
 * echo and text_offset[i] is where tokens[i] begins in it: when echo encodes
 * back to the ids (after their leading control tokens) each token reads the
 * part of echo sentencepiece's spans give it (whitespace the normalizer drops
 * included); otherwise, offsets from decoding the ids and texts as
 * dol_api_logprobs_json_at(at_start) gives them. Control tokens read "",
 * non-ASCII byte-fallback tokens bytes:\xNN (there the join differs). */
cJSON *dol_api_echo_logprobs_json(const dol_tokenizer *tok, const dol_token_logprob *lps,
                                  const int32_t *ids, int n, const char *echo,
                                  size_t echo_len);
/* Append entries to an existing logprobs object (streaming and echo). */
int dol_api_logprobs_append(cJSON *obj, const dol_tokenizer *tok,
                            const dol_token_logprob *lps, const int *offsets,
                            int n);

/* ---- POST /tokenize, POST /detokenize (vLLM-like) ------------------------- */

typedef struct {
    char *model;             /* as sent, or NULL */
    char *prompt;            /* text to encode, or NULL when messages given */
    size_t prompt_len;
    bool add_special_tokens; /* default true: BOS before the text */
    dol_chat_message *messages; /* encoded in the chat format instead */
    int n_messages;
} dol_tokenize_params;

/* {"prompt": str, "add_special_tokens"?: bool} or {"messages": [...]}. */
int dol_api_parse_tokenize(const cJSON *body, dol_tokenize_params *p,
                           dol_api_error *e);
void dol_api_tokenize_params_free(dol_tokenize_params *p);
/* {"tokens": [ids in [0, vocab)]}: *ids malloc'd (non-NULL even when empty). */
int dol_api_parse_detokenize(const cJSON *body, int vocab_size, char **model,
                             int32_t **ids, int *n, dol_api_error *e);

#ifdef __cplusplus
}
#endif
#endif
