/* src/engine/cpu_k_hash.c — the CPU kernels' XXH3-64 checksum (the
 * prepared-weights cache, weights_cache.h), xxHash's header inlined so
 * each variant hashes with its own vector width. Compiled once per variant
 * (cpu_k.h); exports DOL_K(xxh3). */
#include "engine/cpu_k.h"

#include <stddef.h>
#include <stdint.h>

/* ---- checksums ------------------------------------------------------------- */

/* xxHash inlined, so that its XXH3 picks this variant's vector width
 * (XXH_VECTOR follows __AVX512F__ / __AVX2__ / SSE2); the result is the
 * same 64 bits for every width. */
#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t DOL_K(xxh3)(const void *p, size_t n) { return XXH3_64bits(p, n); }
