/* src/api/parse_completion.c — validation of POST /v1/completions and
 * POST /v1/chat/completions bodies.
 *
 * Table-driven: FIELDS lists every known field with its parser and the
 * endpoints that know it (the two share the sampling fields); a field that
 * is absent or null keeps its default; unknown fields are ignored. Every
 * error is a 400 naming the field (param) and saying what was expected.
 * Checks that involve several fields run after the table. */
#include "api/api.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- typed getters ----------------------------------------------------- */

/* The largest integer a JSON number (read as a double) holds exactly: any
 * bound above it could not be enforced exactly (2^53 + 1 reads as 2^53). */
#define MAX_SAFE_INT (((int64_t)1 << 53) - 1)

/* Integral JSON number within [lo, hi] (hi at most MAX_SAFE_INT). */
static int get_int(const cJSON *v, const char *name, int64_t lo, int64_t hi,
                   int64_t *out, dol_api_error *e)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) ||
        v->valuedouble != floor(v->valuedouble)) {
        dol_api_error_invalid(e, name, "'%s' must be an integer.", name);
        return -1;
    }
    double d = v->valuedouble;
    if (d < (double)lo || d > (double)hi) {
        if (hi >= MAX_SAFE_INT && d < (double)lo)
            dol_api_error_invalid(e, name, "'%s' must be >= %lld (got %.17g).",
                                  name, (long long)lo, d);
        else if (hi >= MAX_SAFE_INT)
            dol_api_error_invalid(e, name, "'%s' must be at most %lld (got %.17g).",
                                  name, (long long)hi, d);
        else
            dol_api_error_invalid(e, name,
                                  "'%s' must be between %lld and %lld (got %.17g).",
                                  name, (long long)lo, (long long)hi, d);
        return -1;
    }
    *out = (int64_t)d;
    return 0;
}

/* Finite JSON number within [lo, hi]; lo_open excludes lo itself. */
static int get_num(const cJSON *v, const char *name, double lo, bool lo_open,
                   double hi, float *out, dol_api_error *e)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        dol_api_error_invalid(e, name, "'%s' must be a number.", name);
        return -1;
    }
    double d = v->valuedouble;
    if (d < lo || (lo_open && d == lo) || d > hi) {
        dol_api_error_invalid(e, name, "'%s' must be %s %g and <= %g (got %g).",
                              name, lo_open ? ">" : ">=", lo, hi, d);
        return -1;
    }
    /* The value is kept as a float: one just above an open lower bound
     * (top_p 1e-50) must not round down onto the bound, which means
     * something else (0 = off); it becomes the closest float above it. */
    float f = (float)d;
    if (lo_open && f <= (float)lo) f = nextafterf((float)lo, INFINITY);
    *out = f;
    return 0;
}

static int get_bool(const cJSON *v, const char *name, bool *out,
                    dol_api_error *e)
{
    if (!cJSON_IsBool(v)) {
        dol_api_error_invalid(e, name, "'%s' must be a boolean.", name);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 0;
}


/* ---- configured limits ------------------------------------------------- */

/* A limit of lim: its value, the built-in default when 0, never above hard
 * (the size of the array that holds the values; 0 = none). */
static int limit_of(int v, int def, int hard)
{
    int x = v > 0 ? v : def;
    return hard > 0 && x > hard ? hard : x;
}

static int max_n_of(const dol_api_limits *lim)
{
    return limit_of(lim->max_n, DOL_API_MAX_N, 0);
}

static int max_stop_of(const dol_api_limits *lim)
{
    return limit_of(lim->max_stop, DOL_MAX_STOP, DOL_MAX_STOP);
}

static int max_stop_len_of(const dol_api_limits *lim)
{
    return limit_of(lim->max_stop_len, DOL_API_MAX_STOP_LEN, 0);
}

static int max_logit_bias_of(const dol_api_limits *lim)
{
    return limit_of(lim->max_logit_bias, DOL_MAX_LOGIT_BIAS, DOL_MAX_LOGIT_BIAS);
}

/* max_tokens (or max_completion_tokens) against max_tokens_cap. */
static int check_cap(int64_t x, const char *name, const dol_api_limits *lim,
                     dol_api_error *e)
{
    if (lim->max_tokens_cap <= 0 || x <= lim->max_tokens_cap) return 0;
    dol_api_error_invalid(e, name, "'%s' is %lld; this server generates at most %d tokens "
                          "per choice (max_tokens_cap).", name, (long long)x,
                          lim->max_tokens_cap);
    return -1;
}

/* ---- prompt ------------------------------------------------------------ */

static bool is_int_array(const cJSON *a)
{
    if (!cJSON_IsArray(a)) return false;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) if (!cJSON_IsNumber(x)) return false;
    return true;
}

static int prompt_from_string(const cJSON *s, dol_api_prompt *pr,
                              dol_api_error *e)
{
    size_t n = strlen(s->valuestring);
    pr->text = malloc(n + 1);
    if (!pr->text) return dol_api_error_oom(e);
    memcpy(pr->text, s->valuestring, n + 1);
    pr->text_len = n;
    return 0;
}

static int prompt_from_ids(const cJSON *a, const dol_api_limits *lim,
                           dol_api_prompt *pr, dol_api_error *e)
{
    int n = cJSON_GetArraySize(a);
    if (n == 0) {
        dol_api_error_invalid(e, "prompt", "'prompt' must not be an empty list of token ids.");
        return -1;
    }
    pr->ids = malloc((size_t)n * sizeof *pr->ids);
    if (!pr->ids) return dol_api_error_oom(e);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        double d = x->valuedouble;
        if (!isfinite(d) || d != floor(d) || d < 0 || d >= (double)lim->vocab_size) {
            dol_api_error_invalid(e, "prompt",
                                  "'prompt' token id at index %d is %g; token ids must be "
                                  "integers in [0, %d).", i, d, lim->vocab_size);
            return -1;
        }
        pr->ids[i++] = (int32_t)d;
    }
    pr->n_ids = n;
    return 0;
}

/* prompt: "text" | [ids] | ["text", ...] | [[ids], ...] */
static int f_prompt(const cJSON *v, const dol_api_limits *lim,
                    dol_completion_params *p, dol_api_error *e)
{
    static const char *shape =
        "'prompt' must be a string, an array of token ids, an array of strings "
        "or an array of arrays of token ids.";
    if (cJSON_IsString(v)) {
        p->prompts = calloc(1, sizeof *p->prompts);
        if (!p->prompts) return dol_api_error_oom(e);
        p->n_prompts = 1;
        return prompt_from_string(v, &p->prompts[0], e);
    }
    if (!cJSON_IsArray(v)) {
        dol_api_error_invalid(e, "prompt", "%s", shape);
        return -1;
    }
    int n = cJSON_GetArraySize(v);
    if (n == 0) {
        dol_api_error_invalid(e, "prompt", "'prompt' must not be an empty array.");
        return -1;
    }
    if (is_int_array(v)) {
        p->prompts = calloc(1, sizeof *p->prompts);
        if (!p->prompts) return dol_api_error_oom(e);
        p->n_prompts = 1;
        return prompt_from_ids(v, lim, &p->prompts[0], e);
    }
    if (n > DOL_API_MAX_PROMPTS) {
        dol_api_error_invalid(e, "prompt", "'prompt' holds %d prompts; at most %d are allowed.",
                              n, DOL_API_MAX_PROMPTS);
        return -1;
    }
    const cJSON *first = v->child;
    bool strings = cJSON_IsString(first);
    p->prompts = calloc((size_t)n, sizeof *p->prompts);
    if (!p->prompts) return dol_api_error_oom(e);
    p->n_prompts = n;
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, v) {
        if (strings ? !cJSON_IsString(x) : !is_int_array(x)) {
            dol_api_error_invalid(e, "prompt", "%s (element %d does not match)", shape, i);
            return -1;
        }
        int rc = strings ? prompt_from_string(x, &p->prompts[i], e)
                         : prompt_from_ids(x, lim, &p->prompts[i], e);
        if (rc) return rc;
        i++;
    }
    return 0;
}

/* ---- other fields ------------------------------------------------------ */

static int f_model(const cJSON *v, const dol_api_limits *lim,
                   dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    if (!cJSON_IsString(v)) {
        dol_api_error_invalid(e, "model", "'model' must be a string.");
        return -1;
    }
    p->model = strdup(v->valuestring);
    return p->model ? 0 : dol_api_error_oom(e);
}

static int f_max_tokens(const cJSON *v, const dol_api_limits *lim,
                        dol_completion_params *p, dol_api_error *e)
{
    int64_t x;
    if (get_int(v, "max_tokens", 0, MAX_SAFE_INT, &x, e)) return -1;
    if (check_cap(x, "max_tokens", lim, e)) return -1;
    p->max_tokens = x;
    p->max_tokens_given = true;
    return 0;
}

static int f_temperature(const cJSON *v, const dol_api_limits *lim,
                         dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    return get_num(v, "temperature", 0, false, 2, &p->sampling.temperature, e);
}

static int f_top_p(const cJSON *v, const dol_api_limits *lim,
                   dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    return get_num(v, "top_p", 0, true, 1, &p->sampling.top_p, e);
}

static int f_top_k(const cJSON *v, const dol_api_limits *lim,
                   dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    int64_t x;
    if (get_int(v, "top_k", -1, INT_MAX, &x, e)) return -1;
    p->sampling.top_k = x <= 0 ? 0 : (int)x;
    return 0;
}

static int f_min_p(const cJSON *v, const dol_api_limits *lim,
                   dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    return get_num(v, "min_p", 0, false, 1, &p->sampling.min_p, e);
}

static int f_presence_penalty(const cJSON *v, const dol_api_limits *lim,
                              dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    return get_num(v, "presence_penalty", -2, false, 2,
                   &p->sampling.presence_penalty, e);
}

static int f_frequency_penalty(const cJSON *v, const dol_api_limits *lim,
                               dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    return get_num(v, "frequency_penalty", -2, false, 2,
                   &p->sampling.frequency_penalty, e);
}

static int f_repetition_penalty(const cJSON *v, const dol_api_limits *lim,
                                dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    return get_num(v, "repetition_penalty", 0, true, 10,
                   &p->sampling.repetition_penalty, e);
}

/* logit_bias: {"<token id>": bias in [-100, 100], ...} */
static int f_logit_bias(const cJSON *v, const dol_api_limits *lim,
                        dol_completion_params *p, dol_api_error *e)
{
    if (!cJSON_IsObject(v)) {
        dol_api_error_invalid(e, "logit_bias", "'logit_bias' must be an object mapping token ids to numbers.");
        return -1;
    }
    int n = 0, most = max_logit_bias_of(lim);
    const cJSON *x;
    cJSON_ArrayForEach(x, v) {
        if (n >= most) {
            dol_api_error_invalid(e, "logit_bias", "'logit_bias' holds %d entries; at most %d "
                                  "are allowed (max_logit_bias).", cJSON_GetArraySize(v), most);
            return -1;
        }
        const char *k = x->string;
        char *end = NULL;
        long id = (k && *k >= '0' && *k <= '9') ? strtol(k, &end, 10) : -1;
        if (id < 0 || !end || *end || id >= lim->vocab_size) {
            dol_api_error_invalid(e, "logit_bias",
                                  "'logit_bias' keys must be token ids in [0, %d).",
                                  lim->vocab_size);
            return -1;
        }
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) ||
            x->valuedouble < -100 || x->valuedouble > 100) {
            dol_api_error_invalid(e, "logit_bias",
                                  "'logit_bias' values must be numbers between -100 and 100.");
            return -1;
        }
        p->sampling.logit_bias_ids[n] = (int32_t)id;
        p->sampling.logit_bias_vals[n] = (float)x->valuedouble;
        n++;
    }
    p->sampling.n_logit_bias = n;
    return 0;
}

/* n and best_of: 1..max_n. */
static int get_choices(const cJSON *v, const char *name, const dol_api_limits *lim,
                       int64_t *x, dol_api_error *e)
{
    if (get_int(v, name, 1, MAX_SAFE_INT, x, e)) return -1;
    int most = max_n_of(lim);
    if (*x > most) {
        dol_api_error_invalid(e, name, "'%s' is %lld; at most %d choices per prompt are "
                              "allowed (max_n).", name, (long long)*x, most);
        return -1;
    }
    return 0;
}

static int f_n(const cJSON *v, const dol_api_limits *lim,
               dol_completion_params *p, dol_api_error *e)
{
    int64_t x;
    if (get_choices(v, "n", lim, &x, e)) return -1;
    p->n = (int)x;
    return 0;
}

static int f_best_of(const cJSON *v, const dol_api_limits *lim,
                     dol_completion_params *p, dol_api_error *e)
{
    (void)p;
    int64_t x;
    /* Checked against n once n is known (see cross_checks). */
    return get_choices(v, "best_of", lim, &x, e);
}

static int add_stop(const cJSON *s, const dol_api_limits *lim, dol_completion_params *p,
                    dol_api_error *e)
{
    if (!cJSON_IsString(s) || s->valuestring[0] == '\0') {
        dol_api_error_invalid(e, "stop", "'stop' must be a non-empty string or an array of up "
                              "to %d non-empty strings.", max_stop_of(lim));
        return -1;
    }
    size_t len = strlen(s->valuestring);
    int most = max_stop_len_of(lim);
    if (len > (size_t)most) {
        dol_api_error_invalid(e, "stop", "'stop' string %d is %zu bytes long; at most %d "
                              "bytes are allowed (max_stop_len).", p->n_stop, len, most);
        return -1;
    }
    if (p->n_stop >= max_stop_of(lim)) {   /* never past the array */
        dol_api_error_invalid(e, "stop", "'stop' may hold at most %d strings (max_stop).",
                              max_stop_of(lim));
        return -1;
    }
    p->stop[p->n_stop] = strdup(s->valuestring);
    if (!p->stop[p->n_stop]) return dol_api_error_oom(e);
    p->n_stop++;
    return 0;
}

static int f_stop(const cJSON *v, const dol_api_limits *lim,
                  dol_completion_params *p, dol_api_error *e)
{
    if (!cJSON_IsArray(v)) return add_stop(v, lim, p, e);
    int n = cJSON_GetArraySize(v), most = max_stop_of(lim);
    if (n > most) {
        dol_api_error_invalid(e, "stop", "'stop' holds %d strings; at most %d are allowed "
                              "(max_stop).", n, most);
        return -1;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, v) if (add_stop(x, lim, p, e)) return -1;
    return 0;
}

static int f_stream(const cJSON *v, const dol_api_limits *lim,
                    dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    return get_bool(v, "stream", &p->stream, e);
}

static int f_stream_options(const cJSON *v, const dol_api_limits *lim,
                            dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    if (!cJSON_IsObject(v)) {
        dol_api_error_invalid(e, "stream_options", "'stream_options' must be an object.");
        return -1;
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(v, "include_usage");
    if (u && !cJSON_IsNull(u) &&
        get_bool(u, "stream_options.include_usage", &p->include_usage, e))
        return -1;
    return 0;
}

static int f_seed(const cJSON *v, const dol_api_limits *lim,
                  dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    /* Any 64-bit integer, signed or not (negative seeds wrap). JSON numbers
     * arrive as doubles: every integer from 2^64 - 1024 up reads as 2^64,
     * so 2^64 itself stands for the largest seed, 2^64 - 1, rather than
     * refusing seeds that do fit. */
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) ||
        v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble < -9223372036854775808.0 ||
        v->valuedouble > 18446744073709551616.0) {
        dol_api_error_invalid(e, "seed", "'seed' must be an integer that fits in 64 bits.");
        return -1;
    }
    double d = v->valuedouble;
    p->seed = d < 0 ? (uint64_t)(int64_t)d
              : d >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)d;
    p->has_seed = true;
    return 0;
}

static int f_logprobs(const cJSON *v, const dol_api_limits *lim,
                      dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    int64_t x;
    if (get_int(v, "logprobs", 0, DOL_MAX_LOGPROBS, &x, e)) return -1;
    p->logprobs = (int)x;
    return 0;
}

static int f_echo(const cJSON *v, const dol_api_limits *lim,
                  dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    return get_bool(v, "echo", &p->echo, e);
}

static int f_ignore_eos(const cJSON *v, const dol_api_limits *lim,
                        dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    return get_bool(v, "ignore_eos", &p->ignore_eos, e);
}

static int f_speculative(const cJSON *v, const dol_api_limits *lim,
                         dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    bool on;
    if (get_bool(v, "speculative", &on, e) != 0) return -1;
    p->no_speculation = !on;
    return 0;
}

static int f_user(const cJSON *v, const dol_api_limits *lim,
                  dol_completion_params *p, dol_api_error *e)
{
    (void)lim; (void)p;
    if (!cJSON_IsString(v)) {
        dol_api_error_invalid(e, "user", "'user' must be a string.");
        return -1;
    }
    return 0;
}

/* ---- fields of /v1/completions only -------------------------------------- */

static int f_suffix(const cJSON *v, const dol_api_limits *lim,
                    dol_completion_params *p, dol_api_error *e)
{
    (void)lim; (void)p;
    if (!cJSON_IsString(v)) {
        dol_api_error_invalid(e, "suffix", "'suffix' must be a string.");
        return -1;
    }
    if (v->valuestring[0]) {
        dol_api_error_invalid(e, "suffix", "'suffix' (insertion) is not supported by this "
                              "model; leave it out.");
        return -1;
    }
    return 0;
}

static int f_return_token_ids(const cJSON *v, const dol_api_limits *lim,
                              dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    return get_bool(v, "return_token_ids", &p->return_token_ids, e);
}

/* ---- fields of /v1/chat/completions only --------------------------------- */

static int f_messages(const cJSON *v, const dol_api_limits *lim,
                      dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    return dol_api_parse_messages(v, &p->messages, &p->n_messages, e);
}

static int f_max_completion_tokens(const cJSON *v, const dol_api_limits *lim,
                                   dol_completion_params *p, dol_api_error *e)
{
    int64_t x;
    if (get_int(v, "max_completion_tokens", 1, MAX_SAFE_INT, &x, e)) return -1;
    if (check_cap(x, "max_completion_tokens", lim, e)) return -1;
    p->max_tokens = x;   /* wins over the older max_tokens */
    p->max_tokens_given = true;
    return 0;
}

/* logprobs: true | false; its number of alternatives is top_logprobs. */
static int f_chat_logprobs(const cJSON *v, const dol_api_limits *lim,
                           dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    bool on = false;
    if (get_bool(v, "logprobs", &on, e)) return -1;
    p->logprobs = on ? 0 : -1;
    return 0;
}

/* Runs after f_chat_logprobs (table order). OpenAI allows up to 20. */
static int f_top_logprobs(const cJSON *v, const dol_api_limits *lim,
                          dol_completion_params *p, dol_api_error *e)
{
    (void)lim;
    int64_t x;
    if (get_int(v, "top_logprobs", 0, 20, &x, e)) return -1;
    if (x > DOL_MAX_LOGPROBS) {
        dol_api_error_invalid(e, "top_logprobs", "'top_logprobs' is %lld; this server "
                              "returns at most %d alternatives.", (long long)x, DOL_MAX_LOGPROBS);
        return -1;
    }
    if (p->logprobs < 0) {
        dol_api_error_invalid(e, "top_logprobs",
                              "'top_logprobs' requires 'logprobs' to be true.");
        return -1;
    }
    p->logprobs = (int)x;
    return 0;
}

/* tools / functions: only an empty list is accepted (no tool calling). */
static int refuse_nonempty_list(const cJSON *v, const char *name, dol_api_error *e)
{
    if (!cJSON_IsArray(v)) {
        dol_api_error_invalid(e, name, "'%s' must be an array.", name);
        return -1;
    }
    if (cJSON_GetArraySize(v) > 0) {
        dol_api_error_invalid(e, name, "'%s' is not supported: this server does no tool or "
                              "function calling.", name);
        return -1;
    }
    return 0;
}

static int f_tools(const cJSON *v, const dol_api_limits *lim,
                   dol_completion_params *p, dol_api_error *e)
{
    (void)lim; (void)p;
    return refuse_nonempty_list(v, "tools", e);
}

static int f_functions(const cJSON *v, const dol_api_limits *lim,
                       dol_completion_params *p, dol_api_error *e)
{
    (void)lim; (void)p;
    return refuse_nonempty_list(v, "functions", e);
}

/* tool_choice / function_call: "none" and "auto" (nothing to call) are fine;
 * forcing a call is not. */
static int refuse_forced_call(const cJSON *v, const char *name, dol_api_error *e)
{
    if (cJSON_IsString(v) && (strcmp(v->valuestring, "none") == 0 ||
                              strcmp(v->valuestring, "auto") == 0))
        return 0;
    dol_api_error_invalid(e, name, "'%s' is not supported: this server does no tool or "
                          "function calling (only \"none\" or \"auto\").", name);
    return -1;
}

static int f_tool_choice(const cJSON *v, const dol_api_limits *lim,
                         dol_completion_params *p, dol_api_error *e)
{
    (void)lim; (void)p;
    return refuse_forced_call(v, "tool_choice", e);
}

static int f_function_call(const cJSON *v, const dol_api_limits *lim,
                           dol_completion_params *p, dol_api_error *e)
{
    (void)lim; (void)p;
    return refuse_forced_call(v, "function_call", e);
}

/* response_format: {"type":"text"} | {"type":"json_object"} |
 * {"type":"json_schema","json_schema":{"name"?,"schema","strict"?,
 * "description"?}}. The schema is compiled now (src/constrain), so that
 * everything it cannot enforce is refused before the request is queued. */
static int f_response_format(const cJSON *v, const dol_api_limits *lim,
                             dol_completion_params *p, dol_api_error *e)
{
    static const char *const RF = "response_format";
    const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
    if (!cJSON_IsString(t)) {
        dol_api_error_invalid(e, RF, "'response_format' must be an object with a string 'type'.");
        return -1;
    }
    if (strcmp(t->valuestring, "text") == 0) return 0;
    if (strcmp(t->valuestring, "json_object") == 0) {
        p->grammar = dol_grammar_json_object();
        return p->grammar ? 0 : dol_api_error_oom(e);
    }
    if (strcmp(t->valuestring, "json_schema") != 0) {
        dol_api_error_invalid(e, RF, "'response_format' of type '%.64s' is not supported "
                              "(\"text\", \"json_object\" or \"json_schema\").", t->valuestring);
        return -1;
    }
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(v, "json_schema");
    if (!cJSON_IsObject(js)) {
        dol_api_error_invalid(e, RF, "'response_format.json_schema' must be an object with "
                              "a 'schema'.");
        return -1;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(js, "description");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if ((name && !cJSON_IsString(name)) || (desc && !cJSON_IsString(desc)) ||
        (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))) {
        dol_api_error_invalid(e, RF, "'response_format.json_schema': 'name' and 'description' "
                              "must be strings, 'strict' a boolean.");
        return -1;
    }
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema)) {
        dol_api_error_invalid(e, RF, "'response_format.json_schema.schema' must be a JSON "
                              "Schema object.");
        return -1;
    }
    char *text = cJSON_PrintUnformatted(schema);
    if (!text) return dol_api_error_oom(e);
    char msg[400];
    bool is_oom = false;
    int rc = dol_grammar_from_schema(text, strlen(text), lim->max_grammar_states, &p->grammar,
                                     msg, sizeof msg, &is_oom);
    free(text);
    if (rc == 0) return 0;
    if (is_oom) return dol_api_error_oom(e);
    dol_api_error_invalid(e, RF, "response_format.json_schema.schema: %s.", msg);
    return -1;
}

/* ---- the tables ----------------------------------------------------------- */

typedef int (*field_fn)(const cJSON *v, const dol_api_limits *lim,
                        dol_completion_params *p, dol_api_error *e);

enum { CMPL = 1, CHAT = 2, BOTH = CMPL | CHAT };

/* In order: a parser may rely on an earlier one (top_logprobs on logprobs,
 * max_completion_tokens over max_tokens). */
static const struct {
    const char *name;
    unsigned where;
    field_fn parse;
} FIELDS[] = {
    {"model", BOTH, f_model},
    {"prompt", CMPL, f_prompt},
    {"messages", CHAT, f_messages},
    {"max_tokens", BOTH, f_max_tokens},
    {"max_completion_tokens", CHAT, f_max_completion_tokens},
    {"temperature", BOTH, f_temperature},
    {"top_p", BOTH, f_top_p},
    {"top_k", BOTH, f_top_k},
    {"min_p", BOTH, f_min_p},
    {"presence_penalty", BOTH, f_presence_penalty},
    {"frequency_penalty", BOTH, f_frequency_penalty},
    {"repetition_penalty", BOTH, f_repetition_penalty},
    {"logit_bias", BOTH, f_logit_bias},
    {"n", BOTH, f_n},
    {"best_of", CMPL, f_best_of},
    {"suffix", CMPL, f_suffix},
    {"stop", BOTH, f_stop},
    {"stream", BOTH, f_stream},
    {"stream_options", BOTH, f_stream_options},
    {"seed", BOTH, f_seed},
    {"logprobs", CMPL, f_logprobs},
    {"logprobs", CHAT, f_chat_logprobs},
    {"top_logprobs", CHAT, f_top_logprobs},
    {"echo", CMPL, f_echo},
    {"ignore_eos", BOTH, f_ignore_eos},
    {"speculative", BOTH, f_speculative},
    {"user", BOTH, f_user},
    {"return_token_ids", BOTH, f_return_token_ids},
    {"tools", CHAT, f_tools},
    {"tool_choice", CHAT, f_tool_choice},
    {"functions", CHAT, f_functions},
    {"function_call", CHAT, f_function_call},
    {"response_format", BOTH, f_response_format},
};

static void defaults(dol_completion_params *p, const dol_api_limits *lim)
{
    memset(p, 0, sizeof *p);
    dol_sampling_params_default(&p->sampling);
    p->sampling.temperature = lim->default_temperature;
    p->sampling.top_p = lim->default_top_p;
    p->sampling.top_k = lim->default_top_k > 0 ? lim->default_top_k : 0;
    p->max_tokens = lim->default_max_tokens;
    if (lim->max_tokens_cap > 0 && p->max_tokens > lim->max_tokens_cap)
        p->max_tokens = lim->max_tokens_cap;
    p->n = 1;
    p->logprobs = -1;
}

static int common_checks(const cJSON *body, dol_completion_params *p, dol_api_error *e)
{
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
    if (so && !cJSON_IsNull(so) && !p->stream) {
        dol_api_error_invalid(e, "stream_options",
                              "'stream_options' is only allowed when 'stream' is true.");
        return -1;
    }
    return 0;
}

static int cross_checks(const cJSON *body, dol_completion_params *p,
                        dol_api_error *e)
{
    if (p->n_prompts == 0) {
        dol_api_error_invalid(e, "prompt", "Missing required parameter 'prompt'.");
        return -1;
    }
    if (p->max_tokens == 0 && !p->echo) {
        dol_api_error_invalid(e, "max_tokens",
                              "'max_tokens' must be at least 1 (0 is only allowed with echo).");
        return -1;
    }
    const cJSON *bo = cJSON_GetObjectItemCaseSensitive(body, "best_of");
    if (bo && !cJSON_IsNull(bo) && (int)bo->valuedouble != p->n) {
        dol_api_error_invalid(e, "best_of", "'best_of' other than n is not supported.");
        return -1;
    }
    return common_checks(body, p, e);
}

static int chat_checks(const cJSON *body, dol_completion_params *p, dol_api_error *e)
{
    if (p->n_messages == 0) {
        dol_api_error_invalid(e, "messages", "Missing required parameter 'messages'.");
        return -1;
    }
    /* max_completion_tokens wins over max_tokens, but a max_tokens of 0 is
     * refused even then: every field given is checked. */
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(body, "max_tokens");
    if ((cJSON_IsNumber(mt) && mt->valuedouble == 0) ||
        (p->max_tokens_given && p->max_tokens == 0)) {
        dol_api_error_invalid(e, "max_tokens", "'max_tokens' must be at least 1.");
        return -1;
    }
    return common_checks(body, p, e);
}

static int parse_fields(const cJSON *body, const dol_api_limits *lim, unsigned where,
                        dol_completion_params *p, dol_api_error *e)
{
    defaults(p, lim);
    p->chat = where == CHAT;
    if (!cJSON_IsObject(body)) {
        dol_api_error_invalid(e, NULL, "The request body must be a JSON object.");
        return -1;
    }
    for (size_t i = 0; i < sizeof FIELDS / sizeof FIELDS[0]; i++) {
        if (!(FIELDS[i].where & where)) continue;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, FIELDS[i].name);
        if (!v || cJSON_IsNull(v)) continue;
        if (FIELDS[i].parse(v, lim, p, e)) return -1;
    }
    return 0;
}

int dol_api_parse_completion(const cJSON *body, const dol_api_limits *lim,
                             dol_completion_params *p, dol_api_error *e)
{
    if (parse_fields(body, lim, CMPL, p, e)) return -1;
    return cross_checks(body, p, e);
}

int dol_api_parse_chat(const cJSON *body, const dol_api_limits *lim,
                       dol_completion_params *p, dol_api_error *e)
{
    if (parse_fields(body, lim, CHAT, p, e)) return -1;
    return chat_checks(body, p, e);
}

void dol_api_completion_params_free(dol_completion_params *p)
{
    if (!p) return;
    free(p->model);
    for (int i = 0; i < p->n_prompts; i++) {
        free(p->prompts[i].text);
        free(p->prompts[i].ids);
    }
    free(p->prompts);
    dol_api_messages_free(p->messages, p->n_messages);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    dol_grammar_release(p->grammar);
    memset(p, 0, sizeof *p);
}

/* The prompt-token limit in force below the context, or 0 when the context
 * itself is the limit. */
static int prompt_limit(const dol_api_limits *lim)
{
    int m = lim->max_prompt_tokens;
    return m > 0 && m < lim->context_len ? m : 0;
}

int dol_api_check_prompt_tokens(int64_t n_prompt, const dol_api_limits *lim,
                                const char *param, dol_api_error *e)
{
    int m = prompt_limit(lim);
    if (m == 0 || n_prompt <= m) return 0;
    dol_api_error_set(e, 400, "invalid_request_error", param, "context_length_exceeded",
                      "The %s is %lld tokens long; this server accepts at most %d prompt "
                      "tokens (max_prompt_tokens). Please reduce the length of the %s.",
                      param, (long long)n_prompt, m, param);
    return -1;
}

int dol_api_check_prompt_bound(int64_t min_prompt, const dol_api_limits *lim,
                               const char *param, dol_api_error *e)
{
    int m = prompt_limit(lim);
    if (m == 0 || min_prompt <= m) return 0;
    dol_api_error_set(e, 400, "invalid_request_error", param, "context_length_exceeded",
                      "The %s is at least %lld tokens long (judged from its length, "
                      "without tokenizing it); this server accepts at most %d prompt "
                      "tokens (max_prompt_tokens). Please reduce the length of the %s.",
                      param, (long long)min_prompt, m, param);
    return -1;
}
