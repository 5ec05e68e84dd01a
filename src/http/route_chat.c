/* src/http/route_chat.c — POST /v1/chat/completions: validate the body,
 * build the prompt token ids in the Llama-2 chat format (src/api/chat.c),
 * and run it through the generation machinery of completion.c, which
 * answers with chat.completion objects (or chat.completion.chunk events).
 *
 * Without max_tokens / max_completion_tokens a chat completion runs until
 * EOS or the end of the context: max_tokens becomes the room left after the
 * prompt, as the scheduler counts it (dol_scheduler_fit: the context, capped
 * at what the KV cache can hold for n choices). */
#include "http/http.h"

#include <limits.h>
#include <stdlib.h>

/* The messages' share of the checks before encoding them, from a lower
 * bound on their tokens: over max_prompt_tokens, or no room for even one
 * token of answer (the scheduler's fit). -1 with e. */
static int check_bound(dol_http_req *c, const dol_http_attached *a, const dol_api_limits *lim,
                       int64_t min_ids, int n, dol_api_error *e)
{
    if (dol_api_check_prompt_bound(min_ids, lim, "messages", e)) return -1;
    int fit;
    dol_reason_info why;
    int n_min = min_ids > INT_MAX ? INT_MAX : (int)min_ids;
    if (dol_http_sched_fit(c->srv, a->model_idx, n_min, n, 1, &fit, &why) == DOL_REASON_NONE)
        return 0;
    dol_api_error_prompt_too_long(e, &why, "messages");
    return -1;
}

static int build(dol_http_req *c, const dol_http_attached *a, dol_api_error *e)
{
    cJSON *body = dol_http_body_json(c, e);
    if (!body) return -1;
    dol_api_limits lim;
    dol_http_api_limits(c, a, &lim);
    dol_completion_params p;
    int rc = dol_api_parse_chat(body, &lim, &p, e);
    if (rc) goto out;
    rc = -1;
    if (dol_http_cmpl_prepare(c, a, &p, 1, e)) goto out;
    /* Refuse messages that can never fit before encoding them (on
     * libmicrohttpd's thread; see prompt_ids in route_completions.c). */
    int64_t min_ids = 0;
    if (dol_api_chat_min_tokens(a->tok, p.messages, p.n_messages, &min_ids, e) ||
        check_bound(c, a, &lim, min_ids, p.n, e))
        goto out;
    int32_t *ids = NULL;
    int n_ids = 0;
    if (dol_api_chat_prompt_ids(a->tok, p.messages, p.n_messages, &ids, &n_ids, e)) goto out;
    if (!p.max_tokens_given) {
        int fit;
        dol_reason_info why;
        if (dol_http_sched_fit(c->srv, a->model_idx, n_ids, p.n, -1, &fit, &why)) {
            dol_api_error_from_reason(e, &why, "messages");
            free(ids);
            goto out;
        }
        p.max_tokens = fit;
        if (lim.max_tokens_cap > 0 && p.max_tokens > lim.max_tokens_cap)
            p.max_tokens = lim.max_tokens_cap;
    }
    if (dol_http_cmpl_add(c, a, &p, 0, ids, n_ids, e)) goto out;
    rc = 0;
out:
    dol_api_completion_params_free(&p);
    return rc;
}

enum MHD_Result dol_http_chat(dol_http_req *c)
{
    dol_api_error e;
    dol_http_attached a;
    int w = dol_http_model_acquire(c, &a, &e);
    if (w > 0) return MHD_YES;   /* suspended until the model is loaded */
    if (w < 0 || dol_http_cmpl_begin(c, true, &a, &e) || build(c, &a, &e))
        return dol_http_send_error(c, &e);
    return dol_http_cmpl_submit(c);
}
