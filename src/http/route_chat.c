/* src/http/route_chat.c — POST /v1/chat/completions: validate the body,
 * build the prompt token ids in the Llama-2 chat format (src/api/chat.c),
 * and run it through the generation machinery of generation.c, which
 * answers with chat.completion objects (or chat.completion.chunk events).
 *
 * Without max_tokens / max_completion_tokens a chat completion runs until
 * EOS or the end of the context: max_tokens becomes the room left after the
 * prompt, capped at what the KV cache can hold for n choices (every choice
 * reserves its blocks up front; choices share the prompt's full blocks). */
#include "http/http.h"

#include <stdlib.h>

/* The most tokens each of n choices can generate after an n_prompt-token
 * prompt: the context's room, capped by the KV pool. < 1 when none. */
static int64_t room_left(dol_http_req *c, const dol_http_attached *a, int n_prompt, int n)
{
    int64_t room = (int64_t)a->context_len - n_prompt;
    dol_scheduler_stats st;
    if (dol_http_sched_stats(c->srv, a->model_idx, &st) && st.kv_block_size > 0 &&
        st.kv_blocks_total > 0) {
        int64_t shared = n_prompt / st.kv_block_size;
        int64_t blocks_each = ((int64_t)st.kv_blocks_total + (n - 1) * shared) / n;
        int64_t fit = blocks_each * st.kv_block_size - n_prompt;
        if (fit < room) room = fit;
    }
    return room;
}

static int build(dol_http_req *c, const dol_http_attached *a, dol_api_error *e)
{
    cJSON *body = dol_http_body_json(c, e);
    if (!body) return -1;
    dol_api_limits lim;
    dol_http_api_limits(c, a, &lim);
    dol_completion_params p;
    int rc = dol_api_parse_chat(body, &lim, &p, e);
    cJSON_Delete(body);
    if (rc) goto out;
    rc = -1;
    if (dol_http_gen_prepare(c, a, &p, 1, e)) goto out;
    /* Refuse messages that can never fit before encoding them (on
     * libmicrohttpd's thread; see prompt_ids in route_completions.c). */
    int64_t min_ids = 0;
    if (dol_api_chat_min_tokens(a->tok, p.messages, p.n_messages, &min_ids, e) ||
        dol_api_check_prompt_bound(min_ids, p.max_tokens_given ? p.max_tokens : 1, &lim,
                                   "messages", e))
        goto out;
    int32_t *ids = NULL;
    int n_ids = 0;
    if (dol_api_chat_prompt_ids(a->tok, p.messages, p.n_messages, &ids, &n_ids, e)) goto out;
    if (!p.max_tokens_given) {
        p.max_tokens = room_left(c, a, n_ids, p.n);
        if (lim.max_tokens_cap > 0 && p.max_tokens > lim.max_tokens_cap)
            p.max_tokens = lim.max_tokens_cap;
        if (p.max_tokens < 1) {
            dol_api_error_set(e, 400, "invalid_request_error", "messages",
                              "context_length_exceeded",
                              "This model's maximum context length is %d tokens, and the "
                              "messages take %d: no room is left for the answer.",
                              a->context_len, n_ids);
            free(ids);
            goto out;
        }
    }
    if (dol_http_gen_add(c, a, &p, 0, ids, n_ids, e)) goto out;
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
    if (w < 0 || dol_http_gen_begin(c, true, &a, &e) || build(c, &a, &e))
        return dol_http_send_error(c, &e);
    return dol_http_gen_submit(c);
}
