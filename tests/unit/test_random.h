/* tests/unit/test_random.h — deterministic random numbers for the unit
 * tests: xorshift64* (Vigna 2016) for uniform doubles in [0, 1), Box-Muller
 * for standard normal floats. Each test file includes it once, after
 * defining TEST_RNG_SEED to its own nonzero seed, so its inputs do not
 * depend on the other files. */
#ifndef DOLPHIN_TEST_RANDOM_H
#define DOLPHIN_TEST_RANDOM_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x9E3779B97F4A7C15ull
#endif

static uint64_t g_rng = TEST_RNG_SEED;

static inline double uniform(void) /* xorshift64*, in [0, 1) */
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (double)((g_rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static inline float gaussian(void) /* Box-Muller */
{
    double u = uniform(), v = uniform();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(2.0 * M_PI * v));
}

/* w[rows][cols] = random N(0, sigma) weights with one outlier (x6) per row,
 * as in real checkpoints: the input of the quantizers' tests. */
static inline float *random_outlier_weights(int rows, int cols, float sigma)
{
    float *w = malloc(sizeof(float) * (size_t)rows * cols);
    for (int i = 0; i < rows * cols; i++) w[i] = gaussian() * sigma;
    for (int r = 0; r < rows; r++) w[(size_t)r * cols + (r * 7) % cols] *= 6.0f;
    return w;
}

#endif
