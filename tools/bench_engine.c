/* tools/bench_engine.c — engine-level throughput for a model directory:
 * prefill tokens/s for one prompt, and decode tokens/s at several batch
 * sizes (one forward call per step over all sequences). Prints a table;
 * scripts/bench-decode wraps it. No assertion on time anywhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dolphin/engine.h"
#include "dolphin/model.h"

static int usage(void)
{
    fprintf(stderr, "usage: bench_engine MODEL_DIR [--threads N] [--prompt N] [--decode N]\n"
                    "                    [--batches 1,4,8] [--weights auto|f32|f16|nf4]\n"
                    "                    [--backend auto|cpu|cuda]\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage();
    const char *dir = argv[1];
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), prompt = 128, decode = 32;
    char batches[128] = "1,8";
    dol_weight_format wf = DOL_WEIGHTS_AUTO;
    dol_backend_kind backend = DOL_BACKEND_AUTO;
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc) return usage();
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt")) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode")) decode = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batches")) snprintf(batches, sizeof batches, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--weights")) {
            const char *w = argv[++i];
            wf = !strcmp(w, "f32")   ? DOL_WEIGHTS_F32
                 : !strcmp(w, "f16") ? DOL_WEIGHTS_F16
                 : !strcmp(w, "nf4") ? DOL_WEIGHTS_NF4
                                     : DOL_WEIGHTS_AUTO;
        } else if (!strcmp(argv[i], "--backend")) {
            const char *b = argv[++i];
            if (!strcmp(b, "cpu")) backend = DOL_BACKEND_CPU;
            else if (!strcmp(b, "cuda")) backend = DOL_BACKEND_CUDA;
            else if (!strcmp(b, "auto")) backend = DOL_BACKEND_AUTO;
            else return usage();
        } else return usage();
    }
    char err[DOL_ERR_LEN];
    double t0 = dol_now_ms();
    dol_model *m = NULL;
    if (dol_model_load(dir, &m, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    int max_b = 1;
    for (char *p = batches; *p;) { int b = atoi(p); if (b > max_b) max_b = b; p = strchr(p, ','); if (!p) break; p++; }
    dol_engine_params ep = { .backend = backend, .gpu_memory_fraction = 0.90,
                             .n_threads = threads, .kv_block_size = 16,
                             .kv_cache_tokens = (int64_t)(max_b + 1) * (prompt + decode + 16),
                             .max_seqs = max_b + 1, .max_batch_tokens = prompt > max_b ? prompt : max_b,
                             .weights = wf, .quantize_lm_head = true };
    dol_engine *e = NULL;
    if (dol_engine_create(m, &ep, &e, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    double t_ready = dol_now_ms() - t0;
    int V = dol_engine_vocab_size(e);
    if (prompt + decode > dol_engine_context_len(e)) {
        fprintf(stderr, "bench_engine: prompt + decode exceeds the context\n");
        return 2;
    }
    float *logits = malloc(sizeof(float) * (size_t)V * max_b);
    int n_toks = prompt + decode + 16 + max_b; /* decode runs use toks[b .. 16+b+decode) */
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_toks);
    for (int i = 0; i < n_toks; i++) toks[i] = 3 + (i * 7919) % (V - 3);

    printf("model %s: %d layers, hidden %d, vocab %d, weights %.1f MiB, threads %d, ready in %.0f ms\n",
           m->name, m->cfg.n_layers, m->cfg.hidden_size, V, dol_engine_weight_bytes(e) / 1048576.0,
           threads, t_ready);
    printf("backend %s\n", dol_engine_backend_name(e));
    dol_quant_stats qs;
    dol_engine_quant_stats(e, &qs);
    if (qs.n_quantized > 0)
        printf("quantized %d matrices to nf4 in %.2f s: %.1f MiB -> %.1f MiB; linear layers %.3f x F16\n",
               qs.n_quantized, qs.quant_seconds, qs.quant_bytes_before / 1048576.0,
               qs.quant_bytes_after / 1048576.0, (double)qs.linear_bytes / (double)qs.linear_f16_bytes);

    /* prefill */
    int s = dol_engine_seq_new(e);
    dol_engine_seq_reserve(e, s, prompt);
    dol_batch_item it = { s, prompt, toks, 0, 1, logits };
    dol_engine_forward(e, &it, 1, err, sizeof err); /* warm */
    double best = 1e300;
    for (int rep = 0; rep < 3; rep++) {
        double a = dol_now_ms();
        if (dol_engine_forward(e, &it, 1, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
        double b = dol_now_ms() - a;
        if (b < best) best = b;
    }
    dol_engine_seq_free(e, s);
    printf("%-10s %8s %12s %12s\n", "phase", "batch", "tokens/s", "ms/step");
    printf("%-10s %8d %12.1f %12.2f\n", "prefill", 1, prompt / (best / 1000.0), best);

    /* decode at each batch size */
    double base = 0;
    for (char *p = batches; *p;) {
        int B = atoi(p);
        int seqs[256];
        dol_batch_item items[256];
        for (int b = 0; b < B; b++) {
            seqs[b] = dol_engine_seq_new(e);
            dol_engine_seq_reserve(e, seqs[b], 16 + decode);
            /* a short prompt per sequence, outside the timing */
            dol_batch_item pi = { seqs[b], 16, toks + b, 0, 1, logits };
            dol_engine_forward(e, &pi, 1, err, sizeof err);
        }
        double a = dol_now_ms();
        for (int step = 0; step < decode; step++) {
            for (int b = 0; b < B; b++)
                items[b] = (dol_batch_item){ seqs[b], 1, toks + 16 + step, 16 + step, 1,
                                             logits + (size_t)b * V };
            if (dol_engine_forward(e, items, B, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
        }
        double ms = dol_now_ms() - a;
        double tps = (double)B * decode / (ms / 1000.0);
        if (B == 1) base = tps;
        printf("%-10s %8d %12.1f %12.2f", "decode", B, tps, ms / decode);
        if (base > 0 && B > 1) printf("   (%.2fx batch 1)", tps / base);
        printf("\n");
        for (int b = 0; b < B; b++) dol_engine_seq_free(e, seqs[b]);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    free(logits);
    free(toks);
    dol_engine_free(e);
    dol_model_free(m);
    return 0;
}
