/* src/http/route_completions.c — POST /v1/completions: parse the body,
 * turn each prompt (text or token ids) into prompt ids, build the echo text,
 * and hand the requests to the generation machinery (completion.c). */
#include "http/http.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- POST /v1/completions ------------------------------------------------- */

/* The prompt's ids: token prompts as given, text prompts encoded (with BOS).
 * Encoding runs on libmicrohttpd's thread and takes seconds for a
 * megabyte, so a text that can never fit (judged from a lower bound on its
 * tokens, dol_tokenizer_min_tokens) is refused before it is encoded. */
static int prompt_ids(dol_http_req *c, const dol_http_attached *a, const dol_api_limits *lim,
                      const dol_completion_params *p, dol_api_prompt *pr, int32_t **ids,
                      int *n, dol_api_error *e)
{
    if (!pr->text) {
        *ids = pr->ids;   /* taken over */
        *n = pr->n_ids;
        pr->ids = NULL;
        return 0;
    }
    int64_t min = (int64_t)dol_tokenizer_min_tokens(a->tok, pr->text, pr->text_len) +
                  (dol_tokenizer_bos_id(a->tok) >= 0);
    if (dol_api_check_prompt_bound(min, lim, "prompt", e)) return -1;
    /* only the prompt itself: when it fits, encoding it is cheap enough, and
     * the check after encoding gives the exact figures */
    int fit;
    dol_reason_info why;
    int n_min = min > INT_MAX ? INT_MAX : (int)min;
    if (dol_http_sched_fit(c->srv, a->model_idx, n_min, p->n, p->max_tokens > 0 ? 1 : 0, &fit,
                           &why)) {
        dol_api_error_prompt_too_long(e, &why, "prompt");
        return -1;
    }
    char err[DOL_ERR_LEN];
    size_t cnt = 0;
    if (dol_tokenizer_encode(a->tok, pr->text, pr->text_len, true, ids, &cnt, err, sizeof err)) {
        dol_api_error_set(e, 500, "internal_error", "prompt", NULL,
                          "Tokenizing the prompt failed: %s", err);
        return -1;
    }
    *n = (int)cnt;
    return 0;
}

static char *echo_of(const dol_http_attached *a, const dol_api_prompt *pr, const int32_t *ids,
                     int n)
{
    if (pr->text) return strdup(pr->text);
    char *text = NULL;
    size_t len = 0;
    char err[DOL_ERR_LEN];
    if (dol_tokenizer_decode(a->tok, ids, (size_t)n, &text, &len, err, sizeof err))
        return strdup("");
    return text;
}

/* Validate, tokenize and build the requests; 0 or -1 with e. */
static int build(dol_http_req *c, const dol_http_attached *a, dol_api_error *e)
{
    cJSON *body = dol_http_body_json(c, e);
    if (!body) return -1;
    dol_api_limits lim;
    dol_http_api_limits(c, a, &lim);
    dol_completion_params p;
    int rc = dol_api_parse_completion(body, &lim, &p, e);
    if (rc) goto out;
    rc = -1;
    if (dol_http_cmpl_prepare(c, a, &p, p.n_prompts, e)) goto out;
    for (int i = 0; i < p.n_prompts; i++) {
        int32_t *ids = NULL;
        int n = 0;
        if (prompt_ids(c, a, &lim, &p, &p.prompts[i], &ids, &n, e)) goto out;
        if (dol_http_cmpl_add(c, a, &p, i, ids, n, e)) goto out;
        if (p.echo) {
            c->cmpl->echo_text[i] = echo_of(a, &p.prompts[i], dol_request_prompt(c->cmpl->reqs[i], &n), n);
            if (!c->cmpl->echo_text[i]) {
                dol_api_error_oom(e);
                goto out;
            }
        }
    }
    rc = 0;
out:
    dol_api_completion_params_free(&p);
    return rc;
}

enum MHD_Result dol_http_completions(dol_http_req *c)
{
    dol_api_error e;
    dol_http_attached a;
    int w = dol_http_model_acquire(c, &a, &e);
    if (w > 0) return MHD_YES;   /* suspended until the model is loaded */
    if (w < 0 || dol_http_cmpl_begin(c, false, &a, &e) || build(c, &a, &e))
        return dol_http_send_error(c, &e);
    return dol_http_cmpl_submit(c);
}

