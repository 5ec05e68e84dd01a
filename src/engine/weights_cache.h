/* src/engine/weights_cache.h — the prepared-weights cache file of the CPU
 * backend (docs/configuration.md, "The prepared-weights cache"): the
 * arrays the load-time conversion produces (packed panels, NF4 / Q8_0
 * codes and scales), written once, then memory-mapped read-only by later
 * starts so that nothing is converted again. Private to the engine.
 *
 * File layout (host byte order; the byte order is part of the key):
 *   offset 0: header { magic "DOLWCACH", u32 version, u32 n_arrays,
 *             u8 key[32], u64 file_bytes, u64 table_hash, u64 reserved[2] }
 *             then n_arrays entries { u64 offset, u64 size, u64 hash };
 *             table_hash is XXH3-64 over header (with table_hash 0) + table.
 *   then every array at an offset that is a multiple of
 *   DOL_WCACHE_ALIGN, in the order the caller lists them; hash is the
 *   XXH3-64 of its bytes (xxHash, Debian's libxxhash). */
#ifndef DOLPHIN_ENGINE_WEIGHTS_CACHE_H
#define DOLPHIN_ENGINE_WEIGHTS_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "dolphin/model.h"
#include "engine/threadpool.h"

#define DOL_WCACHE_VERSION 1u
#define DOL_WCACHE_ALIGN 4096u

/* One array of the cache: its size in bytes and where its bytes are
 * (written from, or, after dol_wcache_open, inside the mapping). */
typedef struct {
    void *ptr;
    size_t size;
} dol_wcache_array;

typedef struct dol_wcache dol_wcache;

/* The cache key: SHA-256 over the format version, `layout` (a text naming
 * everything that decides the bytes of the arrays: the layouts, the
 * weights format, the layer range) and dol_model_source_digest(m).
 * 0, or -1 with one line in err. */
int dol_wcache_key(const dol_model *m, const char *layout, uint8_t key[32], char *err,
                   size_t errlen);

/* The file of `key` for model `name` in dir: "<dir>/<name>.<64 hex>.dwc"
 * (characters of name other than [A-Za-z0-9._-] become '_'). */
void dol_wcache_path(const char *dir, const char *name, const uint8_t key[32], char *out,
                     size_t outlen);

/* Open path and check it against key and the n arrays the caller expects
 * (arr[i].size in), then every array's hash, spread over pool.
 *   0: a hit; arr[i].ptr point into the read-only mapping, *out holds it
 *      (dol_wcache_close releases it; the pointers die with it);
 *   1: no such file;
 *  -1: the file is unusable (truncated, bad magic, other version or key,
 *      a table that does not match, a hash mismatch): why says what, in
 *      one line; nothing is held. */
int dol_wcache_open(const char *path, const uint8_t key[32], dol_wcache_array *arr, int n,
                    dol_pool *pool, dol_wcache **out, char *why, size_t whylen);

/* Bytes of the mapped file. */
size_t dol_wcache_bytes(const dol_wcache *c);

void dol_wcache_close(dol_wcache *c);

/* Write the n arrays under key to path atomically (the folder is created
 * when missing, one level): a temporary file in the same directory, fsync, rename over path, fsync of the directory; two
 * writers at once each rename a whole file. Hashes are computed on pool.
 * 0 with *bytes the file size, or -1 with one line in err (the temporary
 * file is removed). */
int dol_wcache_write(const char *path, const uint8_t key[32], const dol_wcache_array *arr, int n,
                     dol_pool *pool, size_t *bytes, char *err, size_t errlen);

#endif
