/* tools/make_random_model.c — writes a random-weight Llama checkpoint in the
 * Hugging Face layout (config.json, generation_config.json, F16 safetensors,
 * sharded with an index when large) for a named shape, deterministic from a
 * seed. Used by the benchmarks (scripts/make-random-model wraps it).
 *
 * Weights: uniform in [-a, a] with a = sqrt(3 / fan_in) (unit-variance
 * outputs), and the two projections that feed the residual stream (o_proj,
 * down_proj) further scaled by 1/sqrt(2 * n_layers) as in GPT-2, so
 * activations stay finite in FP16 at any depth; norms are 1; the embedding
 * has standard deviation 0.02 (HF's initializer_range).
 *
 * --echo: a model that repeats its last token (for speculative decoding's
 * benchmarks: the cost of a real model, proposals that hold): the
 * embedding has standard deviation 1 and lm_head is the same matrix, so
 * the residual stream stays near the token's own row, whose dot product
 * with itself (about hidden) dwarfs every other row's. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <math.h>

#include <cjson/cJSON.h>

#include "dolphin/model.h"
#include "dolphin/sampler.h"

typedef struct {
    const char *name;
    int hidden, inter, layers, heads, kv_heads, vocab, ctx;
} shape;

static const shape SHAPES[] = {
    { "tiny", 128, 344, 3, 8, 4, 32000, 1024 },
    { "110m", 768, 2048, 12, 12, 12, 32000, 2048 },
    { "1b", 2048, 5632, 22, 32, 4, 32000, 2048 },    /* TinyLlama-1.1B */
    { "7b", 4096, 11008, 32, 32, 32, 32000, 4096 },  /* Llama-2-7B */
    { "13b", 5120, 13824, 40, 40, 40, 32000, 4096 }, /* Llama-2-13B */
};

typedef struct {
    char name[128];
    int64_t rows, cols;
    int kind;          /* 0 linear, 1 norm, 2 embedding */
    float scale;       /* extra factor for linears */
    int shard;
    uint64_t off;      /* byte offset within the shard's data */
} tdesc;

static int usage(void)
{
    fprintf(stderr,
            "usage: make_random_model SHAPE OUTDIR [--seed N] [--tokenizer FILE] [--shard-gib N] [--echo]\n"
            "  SHAPE: tiny | 110m | 1b | 7b | 13b\n");
    return 2;
}

static void fill(uint16_t *buf, int64_t n, const tdesc *t, const shape *s, dol_rng *rng)
{
    if (t->kind == 1) {
        for (int64_t i = 0; i < n; i++) buf[i] = dol_f32_to_f16(1.0f);
        return;
    }
    /* uniform [-a, a] has std a / sqrt(3) */
    float a = t->kind == 2 ? 0.02f * sqrtf(3.0f) * t->scale : sqrtf(3.0f / (float)t->cols) * t->scale;
    (void)s;
    for (int64_t i = 0; i < n; i++) buf[i] = dol_f32_to_f16((2.0f * dol_rng_float(rng) - 1.0f) * a);
}

int main(int argc, char **argv)
{
    if (argc < 3) return usage();
    const shape *s = NULL;
    for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++)
        if (strcmp(argv[1], SHAPES[i].name) == 0) s = &SHAPES[i];
    if (!s) { fprintf(stderr, "make_random_model: unknown shape %s\n", argv[1]); return usage(); }
    const char *out = argv[2];
    uint64_t seed = 0;
    const char *tokenizer = NULL;
    double shard_gib = 4.0;
    bool echo = false;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--echo") == 0) { echo = true; continue; }
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) tokenizer = argv[++i];
        else if (strcmp(argv[i], "--shard-gib") == 0 && i + 1 < argc) shard_gib = atof(argv[++i]);
        else return usage();
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "make_random_model: %s: %s\n", out, strerror(errno));
        return 1;
    }

    /* tensor list in Hugging Face order */
    int nt = 3 + 9 * s->layers;
    tdesc *t = calloc((size_t)nt, sizeof *t);
    int k = 0;
    int hd = s->hidden / s->heads, kvd = s->kv_heads * hd;
    float resid = 1.0f / sqrtf(2.0f * s->layers);
    t[k++] = (tdesc){ "model.embed_tokens.weight", s->vocab, s->hidden, 2, 1, 0, 0 };
    for (int l = 0; l < s->layers; l++) {
        struct { const char *n; int64_t r, c; int kind; float sc; } L[9] = {
            { "input_layernorm", 1, s->hidden, 1, 1 },
            { "self_attn.q_proj", s->hidden, s->hidden, 0, 1 },
            { "self_attn.k_proj", kvd, s->hidden, 0, 1 },
            { "self_attn.v_proj", kvd, s->hidden, 0, 1 },
            { "self_attn.o_proj", s->hidden, s->hidden, 0, resid },
            { "post_attention_layernorm", 1, s->hidden, 1, 1 },
            { "mlp.gate_proj", s->inter, s->hidden, 0, 1 },
            { "mlp.up_proj", s->inter, s->hidden, 0, 1 },
            { "mlp.down_proj", s->hidden, s->inter, 0, resid },
        };
        for (int j = 0; j < 9; j++) {
            snprintf(t[k].name, sizeof t[k].name, "model.layers.%d.%s.weight", l, L[j].n);
            t[k].rows = L[j].r; t[k].cols = L[j].c; t[k].kind = L[j].kind; t[k].scale = L[j].sc;
            k++;
        }
    }
    t[k++] = (tdesc){ "model.norm.weight", 1, s->hidden, 1, 1, 0, 0 };
    t[k++] = (tdesc){ "lm_head.weight", s->vocab, s->hidden, 0, 1, 0, 0 };
    if (echo) {   /* lm_head = the embedding, standard deviation 1 */
        t[0].scale = 50.0f;
        t[k - 1].kind = 2;
        t[k - 1].scale = 50.0f;
    }

    /* assign shards */
    uint64_t limit = (uint64_t)(shard_gib * 1073741824.0), cur = 0, total = 0;
    int shard = 0;
    for (int i = 0; i < nt; i++) {
        uint64_t bytes = (uint64_t)(t[i].rows * t[i].cols) * 2;
        if (cur > 0 && cur + bytes > limit) { shard++; cur = 0; }
        t[i].shard = shard;
        t[i].off = cur;
        cur += bytes;
        total += bytes;
    }
    int n_shards = shard + 1;

    dol_rng rng;
    dol_rng_seed(&rng, seed);
    char path[2048];
    cJSON *weight_map = cJSON_CreateObject();
    for (int sh = 0; sh < n_shards; sh++) {
        char fname[128];
        if (n_shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", sh + 1, n_shards);
        cJSON *hdr = cJSON_CreateObject();
        cJSON *meta = cJSON_AddObjectToObject(hdr, "__metadata__");
        cJSON_AddStringToObject(meta, "format", "pt");
        for (int i = 0; i < nt; i++) {
            if (t[i].shard != sh) continue;
            cJSON *e = cJSON_AddObjectToObject(hdr, t[i].name);
            cJSON_AddStringToObject(e, "dtype", "F16");
            cJSON *shp = cJSON_AddArrayToObject(e, "shape");
            if (t[i].kind != 1) cJSON_AddItemToArray(shp, cJSON_CreateNumber((double)t[i].rows));
            cJSON_AddItemToArray(shp, cJSON_CreateNumber((double)t[i].cols));
            cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t[i].off));
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(t[i].off + (uint64_t)(t[i].rows * t[i].cols) * 2)));
            cJSON_AddStringToObject(weight_map, t[i].name, fname);
        }
        char *js = cJSON_PrintUnformatted(hdr);
        cJSON_Delete(hdr);
        size_t jl = strlen(js), padded = (jl + 7) & ~(size_t)7;
        snprintf(path, sizeof path, "%s/%s", out, fname);
        FILE *f = fopen(path, "wb");
        if (!f) { fprintf(stderr, "make_random_model: %s: %s\n", path, strerror(errno)); return 1; }
        uint64_t hl = padded;
        fwrite(&hl, 8, 1, f);
        fwrite(js, 1, jl, f);
        for (size_t p = jl; p < padded; p++) fputc(' ', f);
        free(js);
        for (int i = 0; i < nt; i++) {
            if (t[i].shard != sh) continue;
            int64_t n = t[i].rows * t[i].cols, chunk = 1 << 20;
            uint16_t *buf = malloc(sizeof(uint16_t) * (size_t)chunk);
            dol_rng erng;   /* --echo: the embedding's stream, again for lm_head */
            dol_rng_seed(&erng, seed + 77);
            for (int64_t done = 0; done < n; done += chunk) {
                int64_t m = n - done < chunk ? n - done : chunk;
                fill(buf, m, &t[i], s, echo && t[i].kind == 2 ? &erng : &rng);
                if (fwrite(buf, 2, (size_t)m, f) != (size_t)m) {
                    fprintf(stderr, "make_random_model: %s: write failed\n", path);
                    return 1;
                }
            }
            free(buf);
        }
        if (fclose(f) != 0) { fprintf(stderr, "make_random_model: %s: write failed\n", path); return 1; }
    }
    if (n_shards > 1) {
        cJSON *idx = cJSON_CreateObject();
        cJSON *meta = cJSON_AddObjectToObject(idx, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        cJSON_AddItemToObject(idx, "weight_map", weight_map);
        char *js = cJSON_Print(idx);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
        FILE *f = fopen(path, "w");
        fputs(js, f);
        fclose(f);
        free(js);
        cJSON_Delete(idx);
    } else {
        cJSON_Delete(weight_map);
    }

    snprintf(path, sizeof path, "%s/config.json", out);
    FILE *f = fopen(path, "w");
    fprintf(f,
            "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
            "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
            "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"vocab_size\": %d,\n"
            "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 10000.0,\n"
            "  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": false,\n  \"bos_token_id\": 1,\n"
            "  \"eos_token_id\": 2,\n  \"torch_dtype\": \"float16\",\n  \"rope_scaling\": null,\n"
            "  \"attention_bias\": false\n}\n",
            s->hidden, s->inter, s->layers, s->heads, s->kv_heads, s->vocab, s->ctx);
    fclose(f);
    snprintf(path, sizeof path, "%s/generation_config.json", out);
    f = fopen(path, "w");
    fprintf(f, "{\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2\n}\n");
    fclose(f);
    if (tokenizer) {
        snprintf(path, sizeof path, "%s/tokenizer.model", out);
        FILE *in = fopen(tokenizer, "rb"), *o = fopen(path, "wb");
        if (!in || !o) { fprintf(stderr, "make_random_model: cannot copy %s\n", tokenizer); return 1; }
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, o);
        fclose(in);
        fclose(o);
    }
    printf("make_random_model: %s shape %s: %d tensors, %.2f GiB in %d shard(s), seed %llu\n", out,
           s->name, nt, total / 1073741824.0, n_shards, (unsigned long long)seed);
    free(t);
    return 0;
}
