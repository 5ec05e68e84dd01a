/* tools/check_backends.c — dol-check-backends: the CUDA backend against the
 * CPU backend (the reference) on one model directory, for the GPU kit
 * (scripts/gpu-kit, docs/cuda.md). Both engines get the same prompt (BOS and
 * fixed ids) and decode greedily for --steps tokens; the tool checks that
 * every logit of both is finite, that the greedy ids are equal step by step
 * up to the first step whose CPU top-1/top-2 margin is below --near-tie (a
 * near tie may go either way), and that the logits of the steps compared
 * differ by at most --tol. --logits-out writes the prompt ids and both
 * backends' last-prompt-position logits as JSON for the Hugging Face
 * comparison (scripts/gpukit/hf_compare.py). Prints one RESULT line of
 * key=value pairs; exit 0 when every check passed, 1 otherwise, 2 on usage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dolphin/engine.h"
#include "dolphin/model.h"

#define MAX_STEPS 256

static int usage(void)
{
    fprintf(stderr,
            "usage: dol-check-backends MODEL_DIR [--threads N] [--prompt N] [--steps N]\n"
            "                          [--tol X] [--near-tie X] [--weights auto|f16|nf4]\n"
            "                          [--logits-out FILE.json]\n");
    return 2;
}

typedef struct {
    int32_t ids[MAX_STEPS];     /* greedy ids, one per step */
    float *logits;              /* [steps][V]: row s decides ids[s] */
    double margin[MAX_STEPS];   /* top-1 minus top-2 of row s */
    long nonfinite;             /* non-finite logits over all rows */
    double ready_ms, run_ms;
    char backend[16];
} run_result;

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

static double margin(const float *x, int n, int best)
{
    double second = -INFINITY;
    for (int i = 0; i < n; i++) if (i != best && x[i] > second) second = x[i];
    return (double)x[best] - second;
}

/* Prefill the prompt, then steps-1 greedy decode calls: steps rows of logits. */
static int run_backend(const dol_model *m, dol_backend_kind be, dol_weight_format wf, int threads,
                       const int32_t *prompt, int np, int steps, run_result *r)
{
    char err[DOL_ERR_LEN];
    int V = m->cfg.vocab_size;
    int64_t kv = (np + steps + 15) / 16 * 16;
    dol_engine_params p = { .activations = DOL_ACT_F32, .backend = be, .gpu_memory_utilization = 0.90, .n_threads = threads,
                            .kv_block_size = 16, .kv_cache_tokens = kv, .max_seqs = 2,
                            .max_batch_tokens = np, .weights = wf };
    dol_engine *e = NULL;
    double t0 = dol_now_ms();
    if (dol_engine_create(m, &p, &e, err, sizeof err) != 0) {
        fprintf(stderr, "dol-check-backends: %s engine: %s\n", be == DOL_BACKEND_CUDA ? "cuda" : "cpu", err);
        return -1;
    }
    r->ready_ms = dol_now_ms() - t0;
    snprintf(r->backend, sizeof r->backend, "%s", dol_engine_backend_name(e));
    r->logits = malloc(sizeof(float) * (size_t)V * (size_t)steps);
    int seq = dol_engine_seq_new(e);
    int rc = -1;
    if (!r->logits || seq < 0 || dol_engine_seq_reserve(e, seq, np + steps) != 0) {
        fprintf(stderr, "dol-check-backends: %s: no memory or KV blocks\n", r->backend);
        goto out;
    }
    t0 = dol_now_ms();
    for (int s = 0; s < steps; s++) {
        float *row = r->logits + (size_t)s * V;
        dol_batch_item it = s == 0 ? (dol_batch_item){ seq, np, prompt, 0, 1, row }
                                   : (dol_batch_item){ seq, 1, &r->ids[s - 1], np + s - 1, 1, row };
        if (dol_engine_forward(e, &it, 1, err, sizeof err) != 0) {
            fprintf(stderr, "dol-check-backends: %s forward, step %d: %s\n", r->backend, s, err);
            goto out;
        }
        for (int v = 0; v < V; v++) r->nonfinite += !isfinite(row[v]);
        r->ids[s] = argmax(row, V);
        r->margin[s] = margin(row, V, r->ids[s]);
    }
    r->run_ms = dol_now_ms() - t0;
    rc = 0;
out:
    if (seq >= 0) dol_engine_seq_free(e, seq);
    dol_engine_free(e);
    return rc;
}

static int write_logits_json(const char *path, const dol_model *m, const int32_t *prompt, int np,
                             const run_result *cuda, const run_result *cpu)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int V = m->cfg.vocab_size;
    fprintf(f, "{\"model\": \"%s\", \"vocab\": %d, \"prompt_ids\": [", m->name, V);
    for (int i = 0; i < np; i++) fprintf(f, "%s%d", i ? ", " : "", prompt[i]);
    const run_result *rs[2] = { cuda, cpu };
    const char *names[2] = { "cuda", "cpu" };
    fprintf(f, "]");
    for (int k = 0; k < 2; k++) {
        fprintf(f, ",\n \"%s_last_logits\": [", names[k]);
        for (int v = 0; v < V; v++) fprintf(f, "%s%.9g", v ? "," : "", rs[k]->logits[v]);
        fprintf(f, "]");
    }
    fprintf(f, "}\n");
    return fclose(f);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argv[1][0] == '-') return usage();
    const char *dir = argv[1], *logits_out = NULL;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), np = 16, steps = 8;
    double tol = 0.05, near_tie = 0.1;
    dol_weight_format wf = DOL_WEIGHTS_AUTO;
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc) return usage();
        const char *o = argv[i], *v = argv[++i];
        if (!strcmp(o, "--threads")) threads = atoi(v);
        else if (!strcmp(o, "--prompt")) np = atoi(v);
        else if (!strcmp(o, "--steps")) steps = atoi(v);
        else if (!strcmp(o, "--tol")) tol = atof(v);
        else if (!strcmp(o, "--near-tie")) near_tie = atof(v);
        else if (!strcmp(o, "--logits-out")) logits_out = v;
        else if (!strcmp(o, "--weights")) {
            if (!strcmp(v, "auto")) wf = DOL_WEIGHTS_AUTO;
            else if (!strcmp(v, "f16")) wf = DOL_WEIGHTS_F16;
            else if (!strcmp(v, "nf4")) wf = DOL_WEIGHTS_NF4;
            else {
                fprintf(stderr, "dol-check-backends: --weights: expected auto, f16 or nf4, got '%s'\n", v);
                return 2;
            }
        } else return usage();
    }
    if (threads < 1 || np < 2 || steps < 1 || steps > MAX_STEPS || !(tol > 0) || !(near_tie >= 0))
        return usage();

    char err[DOL_ERR_LEN];
    dol_model *m = NULL;
    if (dol_model_load(dir, &m, err, sizeof err) != 0) {
        fprintf(stderr, "dol-check-backends: %s: %s\n", dir, err);
        return 1;
    }
    int V = m->cfg.vocab_size;
    if (np + steps > m->cfg.max_position_embeddings) {
        fprintf(stderr, "dol-check-backends: prompt %d + steps %d exceed the context %d\n", np, steps,
                m->cfg.max_position_embeddings);
        dol_model_free(m);
        return 2;
    }
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)np);
    if (!prompt) return 1;
    prompt[0] = 1; /* BOS */
    for (int i = 1; i < np; i++) prompt[i] = 3 + (int32_t)((int64_t)i * 7919 % (V - 3));

    run_result cuda = { 0 }, cpu = { 0 };
    int rc = 1;
    if (run_backend(m, DOL_BACKEND_CUDA, wf, threads, prompt, np, steps, &cuda) != 0) goto done;
    printf("cuda: ready in %.0f ms, prefill %d + %d decode steps in %.0f ms\n", cuda.ready_ms, np,
           steps - 1, cuda.run_ms);
    if (run_backend(m, DOL_BACKEND_CPU, wf, threads, prompt, np, steps, &cpu) != 0) goto done;
    printf("cpu (%d threads): ready in %.0f ms, prefill %d + %d decode steps in %.0f ms\n", threads,
           cpu.ready_ms, np, steps - 1, cpu.run_ms);

    /* compare while both have produced the same ids so far */
    int equal = 0, compared = 0;
    double max_d = 0.0, min_margin = INFINITY;
    const char *why = "all steps equal";
    for (int s = 0; s < steps; s++) {
        const float *a = cuda.logits + (size_t)s * V, *b = cpu.logits + (size_t)s * V;
        double d = 0.0;
        for (int v = 0; v < V; v++) {
            double x = fabs((double)a[v] - b[v]);
            if (!(x <= d)) d = x; /* NaN sticks */
        }
        compared++;
        if (!(d <= max_d)) max_d = d;
        if (cpu.margin[s] < min_margin) min_margin = cpu.margin[s];
        printf("step %d: cuda id %d, cpu id %d, cpu margin %.4f, max |dlogit| %.5f\n", s, cuda.ids[s],
               cpu.ids[s], cpu.margin[s], d);
        if (cuda.ids[s] != cpu.ids[s]) {
            why = cpu.margin[s] < near_tie ? "stopped at a near tie" : "ids differ";
            break;
        }
        equal++;
    }
    bool finite = cuda.nonfinite == 0 && cpu.nonfinite == 0;
    bool ids_ok = equal == steps || strcmp(why, "stopped at a near tie") == 0;
    bool tol_ok = max_d <= tol;
    rc = finite && ids_ok && tol_ok ? 0 : 1;
    if (logits_out && write_logits_json(logits_out, m, prompt, np, &cuda, &cpu) != 0) {
        fprintf(stderr, "dol-check-backends: --logits-out %s: cannot write\n", logits_out);
        rc = 1;
    }
    printf("RESULT backend=%s finite=%s nonfinite=%ld equal_steps=%d/%d compared=%d ids=%s "
           "max_abs_dlogit=%.5f tol=%g min_cpu_margin=%.4f status=%s\n",
           cuda.backend, finite ? "yes" : "no", cuda.nonfinite + cpu.nonfinite, equal, steps,
           compared, ids_ok ? "ok" : "DIFFER", max_d, tol, min_margin, rc == 0 ? "pass" : "FAIL");
    if (!ids_ok) printf("greedy ids: %s at step %d (cpu margin %.4f >= near-tie %g)\n", why, equal,
                        cpu.margin[equal], near_tie);
    else if (equal < steps) printf("greedy ids: %s at step %d\n", why, equal);
done:
    free(cuda.logits);
    free(cpu.logits);
    free(prompt);
    dol_model_free(m);
    return rc;
}
