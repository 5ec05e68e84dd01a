/* src/engine/weights_cache.c — the prepared-weights cache file: key,
 * atomic write, mapping and verification (format in weights_cache.h). */
#include "engine/weights_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "dolphin/common.h"
#include "engine/cpu_kernels.h"

#define MAGIC "DOLWCACH"

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t n_arrays;
    uint8_t key[32];
    uint64_t file_bytes;
    uint64_t table_hash;
    uint64_t reserved[2];
} wc_header;

typedef struct {
    uint64_t offset, size, hash;
} wc_entry;

struct dol_wcache {
    void *map;
    size_t len;
};

static uint64_t align_up(uint64_t v) { return (v + DOL_WCACHE_ALIGN - 1) / DOL_WCACHE_ALIGN * DOL_WCACHE_ALIGN; }

int dol_wcache_key(const dol_model *m, const char *layout, uint8_t key[32], char *err,
                   size_t errlen)
{
    uint8_t src[32];
    if (dol_model_source_digest(m, src, err, errlen) != 0) return -1;
    char head[64];
    const uint16_t one = 1;
    snprintf(head, sizeof head, "dolphin weights cache v%u %s-endian", DOL_WCACHE_VERSION,
             *(const uint8_t *)&one ? "little" : "big");
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    sha256_update(&ctx, strlen(head) + 1, (const uint8_t *)head);
    sha256_update(&ctx, strlen(layout) + 1, (const uint8_t *)layout);
    sha256_update(&ctx, sizeof src, src);
    sha256_digest(&ctx, SHA256_DIGEST_SIZE, key);
    return 0;
}

void dol_wcache_path(const char *dir, const char *name, const uint8_t key[32], char *out,
                     size_t outlen)
{
    char safe[128];
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof safe; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        safe[i] = ok ? c : '_';
    }
    safe[i] = '\0';
    if (safe[0] == '.' || safe[0] == '\0') safe[0] = '_';   /* never a hidden file */
    char hex[65];
    for (int k = 0; k < 32; k++) snprintf(hex + 2 * k, 3, "%02x", key[k]);
    size_t n = strlen(dir);
    snprintf(out, outlen, "%s%s%s.%s.dwc", dir, n && dir[n - 1] == '/' ? "" : "/", safe, hex);
}

/* ---- hashes over the pool ----------------------------------------------- */

typedef struct {
    const dol_wcache_array *arr;
    uint64_t *hash;
} hash_job;

/* Array i's XXH3 by the kernel set's vector code (the same value as
 * XXH3_64bits, at up to twice the speed with AVX-512). */
static void hash_task(void *ctx, int i, int worker)
{
    (void)worker;
    const hash_job *j = ctx;
    j->hash[i] = dol_cpu_kernels_get()->xxh3(j->arr[i].ptr, j->arr[i].size);
}

static void hash_all(dol_pool *pool, const dol_wcache_array *arr, int n, uint64_t *hash)
{
    hash_job j = { arr, hash };
    if (pool && n > 1) dol_pool_run(pool, hash_task, &j, n);
    else
        for (int i = 0; i < n; i++) hash_task(&j, i, 0);
}

static uint64_t table_hash(const wc_header *h, const wc_entry *t, int n)
{
    wc_header c = *h;
    c.table_hash = 0;
    XXH3_state_t *s = XXH3_createState();
    if (!s) return 0;
    XXH3_64bits_reset(s);
    XXH3_64bits_update(s, &c, sizeof c);
    XXH3_64bits_update(s, t, sizeof *t * (size_t)n);
    uint64_t v = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return v;
}

/* ---- open ------------------------------------------------------------------ */

int dol_wcache_open(const char *path, const uint8_t key[32], dol_wcache_array *arr, int n,
                    dol_pool *pool, dol_wcache **out, char *why, size_t whylen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return 1;
        dol_set_err(why, whylen, "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        dol_set_err(why, whylen, "not a regular file");
        close(fd);
        return -1;
    }
    const size_t len = (size_t)st.st_size;
    const size_t table_end = sizeof(wc_header) + sizeof(wc_entry) * (size_t)n;
    if (len < table_end) {
        dol_set_err(why, whylen, "truncated: %zu bytes, shorter than its header", len);
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        dol_set_err(why, whylen, "cannot map: %s", strerror(errno));
        return -1;
    }
    const wc_header *h = map;
    const wc_entry *t = (const wc_entry *)(h + 1);
    uint64_t *hash = NULL;
    if (memcmp(h->magic, MAGIC, 8) != 0) {
        dol_set_err(why, whylen, "bad magic (not a Dolphin weights cache)");
        goto bad;
    }
    if (h->version != DOL_WCACHE_VERSION) {
        dol_set_err(why, whylen, "format version %u, this build writes %u", h->version,
                    DOL_WCACHE_VERSION);
        goto bad;
    }
    if (memcmp(h->key, key, 32) != 0) {
        dol_set_err(why, whylen, "key in the header differs from its file name");
        goto bad;
    }
    if (h->file_bytes != len) {
        dol_set_err(why, whylen, "truncated or extended: %zu bytes, header says %llu", len,
                    (unsigned long long)h->file_bytes);
        goto bad;
    }
    if ((int64_t)h->n_arrays != n) {
        dol_set_err(why, whylen, "%u arrays, this model needs %d", h->n_arrays, n);
        goto bad;
    }
    if (table_hash(h, t, n) != h->table_hash) {
        dol_set_err(why, whylen, "header checksum mismatch");
        goto bad;
    }
    for (int i = 0; i < n; i++) {
        if (t[i].offset % DOL_WCACHE_ALIGN || t[i].offset < table_end || t[i].size != arr[i].size ||
            t[i].offset > len || t[i].size > len - t[i].offset) {
            dol_set_err(why, whylen, "array %d: offset %llu size %llu does not fit (want size %zu)",
                        i, (unsigned long long)t[i].offset, (unsigned long long)t[i].size,
                        arr[i].size);
            goto bad;
        }
        arr[i].ptr = (char *)map + t[i].offset;
    }
    /* the reads below are sequential per array: ask for the whole file */
    (void)madvise(map, len, MADV_WILLNEED);
    hash = malloc(sizeof *hash * (size_t)(n ? n : 1));
    if (!hash) {
        dol_set_err(why, whylen, "out of memory");
        goto bad;
    }
    hash_all(pool, arr, n, hash);
    for (int i = 0; i < n; i++)
        if (hash[i] != t[i].hash) {
            dol_set_err(why, whylen, "array %d (offset %llu, %llu bytes): checksum mismatch", i,
                        (unsigned long long)t[i].offset, (unsigned long long)t[i].size);
            goto bad;
        }
    free(hash);
    dol_wcache *c = malloc(sizeof *c);
    if (!c) {
        dol_set_err(why, whylen, "out of memory");
        goto bad;
    }
    c->map = map;
    c->len = len;
    *out = c;
    return 0;
bad:
    free(hash);
    for (int i = 0; i < n; i++) arr[i].ptr = NULL;
    munmap(map, len);
    return -1;
}

size_t dol_wcache_bytes(const dol_wcache *c) { return c ? c->len : 0; }

void dol_wcache_close(dol_wcache *c)
{
    if (!c) return;
    munmap(c->map, c->len);
    free(c);
}

/* ---- write ----------------------------------------------------------------- */

static int write_all(int fd, const void *buf, size_t len, uint64_t off)
{
    const char *p = buf;
    while (len > 0) {
        size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
        ssize_t w = pwrite(fd, p, chunk, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        off += (uint64_t)w;
        len -= (size_t)w;
    }
    return 0;
}

int dol_wcache_write(const char *path, const uint8_t key[32], const dol_wcache_array *arr, int n,
                     dol_pool *pool, size_t *bytes, char *err, size_t errlen)
{
    char tmp[4200], dirbuf[4200];
    snprintf(dirbuf, sizeof dirbuf, "%s", path);
    const char *dir = dirname(dirbuf);
    snprintf(tmp, sizeof tmp, "%s/.dwc-tmp-XXXXXX", dir);
    wc_entry *t = calloc((size_t)(n ? n : 1), sizeof *t);
    uint64_t *hash = calloc((size_t)(n ? n : 1), sizeof *hash);
    int fd = -1, rc = -1;
    const char *what = "write";
    if (!t || !hash) {
        errno = ENOMEM;
        what = "prepare";
        goto done;
    }
    (void)mkdir(dir, 0755);   /* the folder itself, one level, when missing */
    fd = mkstemp(tmp);
    if (fd < 0) {
        what = "create a temporary file";
        tmp[0] = '\0';
        goto done;
    }
    (void)fchmod(fd, 0644);
    hash_all(pool, arr, n, hash);
    const size_t table_end = sizeof(wc_header) + sizeof(wc_entry) * (size_t)n;
    uint64_t off = align_up(table_end);
    for (int i = 0; i < n; i++) {
        t[i] = (wc_entry){ off, arr[i].size, hash[i] };
        off = align_up(off + arr[i].size);
    }
    wc_header h = { .version = DOL_WCACHE_VERSION, .n_arrays = (uint32_t)n, .file_bytes = off };
    memcpy(h.magic, MAGIC, 8);
    memcpy(h.key, key, 32);
    h.table_hash = table_hash(&h, t, n);
    /* the size first (padding stays sparse), the arrays, the header last */
    if (ftruncate(fd, (off_t)off) != 0) goto done;
    for (int i = 0; i < n; i++)
        if (write_all(fd, arr[i].ptr, arr[i].size, t[i].offset) != 0) goto done;
    if (write_all(fd, t, sizeof *t * (size_t)n, sizeof h) != 0) goto done;
    if (write_all(fd, &h, sizeof h, 0) != 0) goto done;
    what = "fsync";
    if (fsync(fd) != 0) goto done;
    what = "close";
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) goto done;
    what = "rename";
    if (rename(tmp, path) != 0) goto done;
    tmp[0] = '\0';
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);   /* the rename itself on disk */
        close(dfd);
    }
    *bytes = off;
    rc = 0;
done:
    if (rc != 0) dol_set_err(err, errlen, "cannot %s in %s: %s", what, dir, strerror(errno));
    if (fd >= 0) close(fd);
    if (tmp[0]) unlink(tmp);
    free(t);
    free(hash);
    return rc;
}
