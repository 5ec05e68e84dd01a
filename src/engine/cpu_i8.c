/* src/engine/cpu_i8.c — the run-time choice of the 8-bit-activation kernel
 * set (cpu_i8.h), the activation buffers and the NF4 int8 code book. The
 * kernels themselves: cpu_k_i8.c, compiled once per set. */
#include "engine/cpu_i8.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dolphin/log.h"
#include "engine/cpu_kernels.h"

/* round(level * 127) of dol_nf4_levels, ascending (tests/unit/test_i8.c
 * checks them against the levels). */
const int8_t dol_nf4_i8_codes[16] = { -127, -88, -67, -50, -36, -23, -12, 0,
                                      10,   20,  31,  43,  56,  71,  92,  127 };

#ifdef DOLPHIN_CPU_KERNELS_X86
#include <cpuid.h>
static const dol_cpu_i8 *const all_sets[] = { &dol_cpu_i8_avx512vnni, &dol_cpu_i8_avxvnni, &dol_cpu_i8_avx2 };
#define N_SETS 3

/* Whether this CPU and OS run set s: the F32 avx2 set's needs (cpu_ops.c)
 * plus VNNI, VEX (cpuid 7.1 eax bit 4) or EVEX (7.0 ecx bit 11, with the
 * avx512 set's OS state). */
static bool usable(const dol_cpu_i8 *s)
{
    const bool avx2 = dol_cpu_kernels_find("avx2") != NULL;
    if (s == &dol_cpu_i8_avx2) return avx2;
    unsigned a, b, c, d;
    if (s == &dol_cpu_i8_avxvnni)
        return avx2 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
    return dol_cpu_kernels_find("avx512") != NULL && __get_cpuid_count(7, 0, &a, &b, &c, &d) &&
           (c & (1u << 11));
}
#else
static const dol_cpu_i8 *const *all_sets = NULL;
#define N_SETS 0
static bool usable(const dol_cpu_i8 *s)
{
    (void)s;
    return false;
}
#endif

const dol_cpu_i8 *dol_cpu_i8_find(const char *name)
{
    for (int i = 0; name && i < N_SETS; i++)
        if (strcmp(all_sets[i]->name, name) == 0) return usable(all_sets[i]) ? all_sets[i] : NULL;
    return NULL;
}

static _Atomic(const dol_cpu_i8 *) active;
static atomic_bool chosen;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    const dol_cpu_i8 *s = NULL;
    for (int i = 0; i < N_SETS && !s; i++)
        if (usable(all_sets[i])) s = all_sets[i];
    const char *env = getenv("DOLPHIN_CPU_I8");
    if (env && *env && strcmp(env, "auto") != 0) {
        const dol_cpu_i8 *want = dol_cpu_i8_find(env);
        if (want) {
            s = want;
        } else {
            char q[96];
            dol_log(DOL_LOG_WARN, "cpu_i8_override_ignored", "env=DOLPHIN_CPU_I8 value=%s using=%s",
                    dol_log_quote(env, q, sizeof q), s ? s->name : "none");
        }
    }
    atomic_store_explicit(&active, s, memory_order_release);
    atomic_store_explicit(&chosen, true, memory_order_release);
}

const dol_cpu_i8 *dol_cpu_i8_get(void)
{
    if (!atomic_load_explicit(&chosen, memory_order_acquire)) pthread_once(&choose_once, choose);
    if (dol_cpu_kernels_get()->lanes == 1) return NULL; /* the portable F32 set: no int8 */
    return atomic_load_explicit(&active, memory_order_acquire);
}

int dol_cpu_i8_set(const char *name)
{
    const dol_cpu_i8 *s = dol_cpu_i8_find(name);
    if (!s) return -1;
    pthread_once(&choose_once, choose);
    atomic_store_explicit(&active, s, memory_order_release);
    return 0;
}

bool dol_cpu_i8_takes(dol_dtype t, int K)
{
    if (t == DOL_I8_NF4) return K % 64 == 0;
    if (t == DOL_I8_Q8) return K % DOL_I8_BLOCK == 0;
    return dol_dtype_is_block(t) && K % DOL_I8_BLOCK == 0 && K % dol_dtype_block(t) == 0;
}

int dol_cpu_i8_act_reserve(dol_i8_act *a, int T, int K)
{
    const int nb = K / DOL_I8_BLOCK;
    if ((size_t)T > a->cap || K > a->K_cap) {
        const size_t rows = (size_t)T > a->cap ? (size_t)T : a->cap;
        const int kc = K > a->K_cap ? K : a->K_cap, nbc = kc / DOL_I8_BLOCK;
        int8_t *q = aligned_alloc(64, (rows * (size_t)kc + 63) / 64 * 64);
        float *d = malloc(sizeof(float) * rows * (size_t)nbc);
        float *s = malloc(sizeof(float) * 8 * rows * (size_t)nbc);
        float *dv = aligned_alloc(64, (sizeof(float) * 8 * rows * (size_t)nbc + 63) / 64 * 64);
        int32_t *ns = aligned_alloc(64, (sizeof(int32_t) * 8 * rows * (size_t)nbc + 63) / 64 * 64);
        int32_t *sq = malloc(sizeof(int32_t) * 2 * rows * (size_t)nbc);
        float *sd = malloc(sizeof(float) * rows * (size_t)nbc);
        if (!q || !d || !s || !dv || !ns || !sq || !sd) {
            free(sd);
            free(sq);
            free(q);
            free(d);
            free(s);
            free(dv);
            free(ns);
            return -1;
        }
        dol_cpu_i8_act_free(a);
        a->q = q;
        a->d = d;
        a->s = s;
        a->dv = dv;
        a->ns = ns;
        a->sq = sq;
        a->sd = sd;
        a->cap = rows;
        a->K_cap = kc;
    }
    a->T = T;
    a->K = K;
    a->nb = nb;
    return 0;
}

void dol_cpu_i8_act_free(dol_i8_act *a)
{
    free(a->q);
    free(a->d);
    free(a->s);
    free(a->dv);
    free(a->ns);
    free(a->sq);
    free(a->sd);
    a->q = NULL;
    a->ns = a->sq = NULL;
    a->d = a->s = a->dv = a->sd = NULL;
    a->cap = 0;
    a->K_cap = 0;
}
