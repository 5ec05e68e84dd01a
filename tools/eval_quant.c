/* tools/eval_quant.c — accuracy of quantized weights (nf4 or int8) against
 * F32 on the golden fixtures (scripts/eval-quant wraps it). For each model it
 * loads the checkpoint twice through the engine API (weights f32 and the
 * scheme) and prints,
 * per golden case and on average:
 *   - the mean absolute logit difference nf4 vs f32: over every position of
 *     prompt + golden continuation (teacher forcing), and at the last prompt
 *     position alone;
 *   - the greedy agreement length: how many leading tokens of the engine's
 *     greedy continuation equal the golden greedy_ids (nf4, and f32 for
 *     reference);
 * and, for the model whose first case has an empty prompt (stories260K's
 * 256-token golden story), the average negative log-likelihood f32 and nf4
 * assign to that story (mean over its tokens of -log softmax(logits)[next]),
 * with the greedy text; and the mean NLL of all the full-precision golden
 * continuations under f32 and under the scheme, beside the float64
 * reference's figures (golden/quant-MODEL.json). No thresholds: it reports. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dolphin/engine.h"
#include "dolphin/model.h"
#include "dolphin/tokenizer.h"
#include "../tests/fixtures.h"

#define MAX_IDS 2048

static int usage(void)
{
    fprintf(stderr, "usage: dol-eval-quant SHARED_DIR MODEL [MODEL...] [--threads N]\n"
                    "                      [--weights nf4|int8] [--quantize-lm-head]\n"
                    "  SHARED_DIR holds models/MODEL and golden/MODEL.json\n");
    return 2;
}

static void die(const char *what, const char *err)
{
    fprintf(stderr, "dol-eval-quant: %s: %s\n", what, err);
    exit(1);
}

/* Logits of every position of ids[0..n), one forward call per 256 tokens. */
static float *all_logits(dol_engine *e, const int32_t *ids, int n)
{
    int V = dol_engine_vocab_size(e);
    float *logits = malloc(sizeof(float) * (size_t)V * n);
    char err[DOL_ERR_LEN];
    int seq = dol_engine_seq_new(e);
    if (!logits || seq < 0 || dol_engine_seq_reserve(e, seq, n) != 0) die("forward", "no memory or KV blocks");
    for (int done = 0; done < n;) {
        int k = n - done < 256 ? n - done : 256;
        dol_batch_item it = { seq, k, ids + done, done, k, logits + (size_t)done * V };
        if (dol_engine_forward(e, &it, 1, err, sizeof err) != 0) die("forward", err);
        done += k;
    }
    dol_engine_seq_free(e, seq);
    return logits;
}


/* Greedy continuation of the prompt, up to max_new ids; stops at BOS/EOS
 * like the golden reference. */
static int greedy(dol_engine *e, const int32_t *prompt, int np, int max_new, int32_t *out)
{
    int V = dol_engine_vocab_size(e);
    float *logits = malloc(sizeof(float) * (size_t)V);
    char err[DOL_ERR_LEN];
    int seq = dol_engine_seq_new(e);
    if (!logits || seq < 0 || dol_engine_seq_reserve(e, seq, np + max_new) != 0) die("greedy", "no memory or KV blocks");
    dol_batch_item it = { seq, np, prompt, 0, 1, logits };
    if (dol_engine_forward(e, &it, 1, err, sizeof err) != 0) die("greedy", err);
    int n = 0;
    while (n < max_new) {
        int32_t id = fixture_argmax(logits, V);
        if (id == 1 || id == 2) break;
        out[n++] = id;
        if (n == max_new) break;
        dol_batch_item d = { seq, 1, &out[n - 1], np + n - 1, 1, logits };
        if (dol_engine_forward(e, &d, 1, err, sizeof err) != 0) die("greedy", err);
    }
    dol_engine_seq_free(e, seq);
    free(logits);
    return n;
}

static int agreement(const int32_t *a, int na, const int32_t *b, int nb)
{
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* Mean over i < n-1 of -log softmax(logits[i])[ids[i+1]]. */
static double mean_nll(const float *logits, int V, const int32_t *ids, int n)
{
    double sum = 0.0;
    for (int i = 0; i + 1 < n; i++) {
        const float *l = logits + (size_t)i * V;
        double mx = l[fixture_argmax(l, V)], z = 0.0;
        for (int v = 0; v < V; v++) z += exp(l[v] - mx);
        sum += log(z) - (l[ids[i + 1]] - mx);
    }
    return sum / (n - 1);
}

static double mean_abs_diff(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += fabs((double)a[i] - b[i]);
    return s / (double)n;
}

static dol_engine *open_engine(const dol_model *m, dol_weight_format wf, bool head, int threads)
{
    dol_engine_params p = { .activations = DOL_ACT_F32, .n_threads = threads, .kv_block_size = 16, .max_seqs = 4,
                            .max_batch_tokens = 256, .weights = wf, .quantize_lm_head = head };
    dol_engine *e = NULL;
    char err[DOL_ERR_LEN];
    if (dol_engine_create(m, &p, &e, err, sizeof err) != 0) die(m->name, err);
    return e;
}

/* Sum of -log softmax(logits)[next] over the continuation ids[np..n). */
static double nll_sum(const float *logits, int V, const int32_t *ids, int np, int n)
{
    double sum = 0.0;
    for (int i = np - 1; i < n - 1; i++) {
        const float *l = logits + (size_t)i * V;
        double mx = l[fixture_argmax(l, V)], z = 0.0;
        for (int v = 0; v < V; v++) z += exp(l[v] - mx);
        sum += log(z) - (l[ids[i + 1]] - mx);
    }
    return sum;
}

static void eval_model(const char *shared, const char *name, int threads, bool head,
                       dol_weight_format wq, const char *scheme)
{
    char dir[1200], path[1300], err[DOL_ERR_LEN];
    snprintf(dir, sizeof dir, "%s/models/%s", shared, name);
    snprintf(path, sizeof path, "%s/golden/%s.json", shared, name);
    cJSON *g = fixture_json_at(path);
    if (!g) die(path, "cannot read or parse");
    dol_model *m = NULL;
    if (dol_model_load(dir, &m, err, sizeof err) != 0) die(dir, err);
    dol_engine *ef = open_engine(m, DOL_WEIGHTS_F32, head, threads);
    dol_engine *eq = open_engine(m, wq, head, threads);
    dol_quant_stats qs;
    dol_engine_quant_stats(eq, &qs);
    int V = m->cfg.vocab_size;

    printf("== %s (checkpoint %s; %s: %d matrices, lm_head %s, linear layers %.3f x F16, "
           "quantized in %.3f s)\n",
           name, dol_dtype_name(m->layers[0].q.dtype), scheme, qs.n_quantized,
           head ? "quantized" : "kept", (double)qs.linear_bytes / (double)qs.linear_f16_bytes,
           qs.quant_seconds);
    printf("%-4s %-34s %7s %12s %12s %9s %9s\n", "case", "prompt", "tokens", "|dlogit| all",
           "|dlogit| end", scheme, "agree f32");
    double sum_all = 0, sum_end = 0, sum_agree = 0, sum_agree_f = 0, sum_len = 0;
    double nll_f = 0, nll_q = 0;
    int n_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
        static int32_t ids[MAX_IDS], got[MAX_IDS];
        int np = fixture_ids(cJSON_GetObjectItem(c, "prompt_ids"), ids, MAX_IDS);
        int ng = fixture_ids(cJSON_GetObjectItem(c, "greedy_ids"), ids + np, MAX_IDS - np);
        int max_new = cJSON_GetObjectItem(c, "max_tokens")->valueint;
        int n = np + ng;
        float *lf = all_logits(ef, ids, n), *lq = all_logits(eq, ids, n);
        double d_all = mean_abs_diff(lf, lq, (size_t)V * n);
        double d_end = mean_abs_diff(lf + (size_t)(np - 1) * V, lq + (size_t)(np - 1) * V, (size_t)V);
        nll_f += nll_sum(lf, V, ids, np, n);
        nll_q += nll_sum(lq, V, ids, np, n);
        int nq = greedy(eq, ids, np, max_new, got);
        int agree = agreement(got, nq, ids + np, ng);
        int nf = greedy(ef, ids, np, max_new, got);
        int agree_f = agreement(got, nf, ids + np, ng);
        char shown[40];
        const char *prompt = cJSON_GetObjectItem(c, "prompt")->valuestring;
        int k = 0;
        for (const char *p = prompt; *p && k < 30; p++)
            shown[k++] = (*p == '\n' || *p == '\t') ? ' ' : *p;
        shown[k] = 0;
        char quoted[48];
        snprintf(quoted, sizeof quoted, "\"%s%s\"", shown, strlen(prompt) > 30 ? "..." : "");
        printf("%-4d %-34s %7d %12.4f %12.4f %5d/%-3d %5d/%-3d\n", n_cases, quoted, n, d_all, d_end,
               agree, ng, agree_f, ng);
        sum_all += d_all;
        sum_end += d_end;
        sum_agree += agree;
        sum_agree_f += agree_f;
        sum_len += ng;
        n_cases++;
        free(lf);
        free(lq);
    }
    printf("%-4s %-34s %7s %12.4f %12.4f %9.1f %9.1f   (of %.1f)\n", "mean", "", "",
           sum_all / n_cases, sum_end / n_cases, sum_agree / n_cases, sum_agree_f / n_cases,
           sum_len / n_cases);
    {
        snprintf(path, sizeof path, "%s/golden/quant-%s.json", shared, name);
        cJSON *qg = fixture_json_at(path);
        const cJSON *r = qg ? cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(
                                  cJSON_GetObjectItem(qg, "schemes"), scheme),
                                  "nll_of_reference_continuations"), "quantized") : NULL;
        const cJSON *rf = qg ? cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(
                                   cJSON_GetObjectItem(qg, "schemes"), scheme),
                                   "nll_of_reference_continuations"), "full_precision") : NULL;
        nll_f /= sum_len;
        nll_q /= sum_len;
        printf("NLL of the golden continuations (%.0f tokens): f32 %.4f  %s %.4f (%+.2f %%)", sum_len,
               nll_f, scheme, nll_q, 100.0 * (nll_q - nll_f) / nll_f);
        if (cJSON_IsNumber(r) && cJSON_IsNumber(rf))
            printf("; float64 reference: %.4f -> %.4f", rf->valuedouble, r->valuedouble);
        printf("\n");
        cJSON_Delete(qg);
    }

    /* the golden story: the empty-prompt case, [BOS] + its greedy ids */
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(g, "cases"), 0);
    if (c0 && strcmp(cJSON_GetObjectItem(c0, "prompt")->valuestring, "") == 0) {
        static int32_t ids[MAX_IDS], got[MAX_IDS];
        int n = fixture_ids(cJSON_GetObjectItem(c0, "prompt_ids"), ids, MAX_IDS);
        n += fixture_ids(cJSON_GetObjectItem(c0, "greedy_ids"), ids + n, MAX_IDS - n);
        dol_engine *eh = open_engine(m, DOL_WEIGHTS_F16, head, threads);
        float *lf = all_logits(ef, ids, n), *lh = all_logits(eh, ids, n), *lq = all_logits(eq, ids, n);
        double nf = mean_nll(lf, V, ids, n), nh = mean_nll(lh, V, ids, n), nq = mean_nll(lq, V, ids, n);
        printf("golden story (%d tokens) average NLL: f32 %.4f  f16 %.4f  %s %.4f  (%+.1f %% vs f32)\n",
               n - 1, nf, nh, scheme, nq, 100.0 * (nq - nf) / nf);
        int ng = greedy(eq, ids, 1, 256, got);
        snprintf(path, sizeof path, "%s/tokenizer.model", dir);
        dol_tokenizer *tok = NULL;
        char *text = NULL;
        size_t len = 0;
        if (dol_tokenizer_load(path, &tok, err, sizeof err) != 0) die(path, err);
        if (dol_tokenizer_decode(tok, got, (size_t)ng, &text, &len, err, sizeof err) != 0) die("decode", err);
        printf("%s greedy text from BOS (%d tokens):\n%s\n", scheme, ng, text);
        free(text);
        dol_tokenizer_free(tok);
        free(lf);
        free(lh);
        free(lq);
        dol_engine_free(eh);
    }
    printf("\n");
    dol_engine_free(ef);
    dol_engine_free(eq);
    dol_model_free(m);
    cJSON_Delete(g);
}

int main(int argc, char **argv)
{
    if (argc < 3) return usage();
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    bool head = false;
    dol_weight_format wq = DOL_WEIGHTS_NF4;
    const char *scheme = "nf4";
    const char *models[16];
    int n_models = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-quantize-lm-head")) head = false;
        else if (!strcmp(argv[i], "--quantize-lm-head")) head = true;
        else if (!strcmp(argv[i], "--weights") && i + 1 < argc) {
            scheme = argv[++i];
            if (!strcmp(scheme, "nf4")) wq = DOL_WEIGHTS_NF4;
            else if (!strcmp(scheme, "int8")) wq = DOL_WEIGHTS_INT8;
            else return usage();
        }
        else if (argv[i][0] == '-' || n_models == 16) return usage();
        else models[n_models++] = argv[i];
    }
    if (threads < 1) threads = 1;
    for (int i = 0; i < n_models; i++) eval_model(argv[1], models[i], threads, head, wq, scheme);
    return 0;
}
