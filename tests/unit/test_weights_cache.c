/* tests/unit/test_weights_cache.c — the CPU prepared-weights cache
 * (weights_cache_dir, docs/configuration.md): a second start is a hit and
 * gives the very logits of a start without the cache (f32, f16, nf4, int8,
 * a single file and shards); a changed checkpoint or another format is a
 * miss with a new file; a corrupt, truncated or foreign file is detected,
 * removed and rebuilt; a folder that cannot be written still starts.
 * Whether a start hit, missed or rebuilt is read from its log line
 * (stderr captured around dol_engine_create). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "test_fixtures.h"
#include "engine/cpu_kernels.h"
#include "dolphin/engine.h"
#include "dolphin/log.h"
#include "dolphin/model.h"

#define N_IDS 24

static char tmpdir[256];

static int setup(void **state)
{
    (void)state;
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/dol-wcache-XXXXXX", t && t[0] ? t : "/tmp");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* An engine over m in format wf with the cache in `dir` (NULL: off); what
 * it logged meanwhile goes to log (n bytes, NUL-terminated). */
static dol_engine *open_logged(const dol_model *m, dol_weight_format wf, const char *dir,
                               char *log, size_t n)
{
    dol_engine_params p = { .activations = DOL_ACT_F32, .n_threads = 2, .kv_block_size = 16, .max_seqs = 2,
                            .max_batch_tokens = 64, .kv_cache_tokens = 64, .weights = wf,
                            .weights_cache_dir = dir };
    char path[300];
    snprintf(path, sizeof path, "%s/log.txt", tmpdir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    dol_engine *e = NULL;
    char err[DOL_ERR_LEN];
    int rc = dol_engine_create(m, &p, &e, err, sizeof err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t got = pread(fd, log, n - 1, 0);
    close(fd);
    log[got > 0 ? got : 0] = '\0';
    if (rc != 0) fail_msg("%s", err);
    return e;
}

/* Logits of N_IDS fixed tokens (every position), malloc'd. */
static float *logits_of(dol_engine *e)
{
    int32_t ids[N_IDS];
    for (int i = 0; i < N_IDS; i++) ids[i] = i == 0 ? 1 : (int32_t)(37 * i + 11) % 250 + 3;
    float *l = malloc(sizeof(float) * (size_t)dol_engine_vocab_size(e) * N_IDS);
    test_forward_all(e, ids, N_IDS, l);
    return l;
}

/* The number of cache files (*.dwc) in dir; the last one's path to path. */
static int cache_files(const char *dir, char *path, size_t n)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int count = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 4 && strcmp(de->d_name + l - 4, ".dwc") == 0) {
            count++;
            if (path) snprintf(path, n, "%s/%s", dir, de->d_name);
        }
    }
    closedir(d);
    return count;
}

/* One start with the cache: its result must be `want` ("hit", "miss",
 * "rebuilt") and its logits those of `ref`. */
static void start_expect(const dol_model *m, dol_weight_format wf, const char *dir,
                         const float *ref, const char *want)
{
    char log[8192], line[64];
    dol_engine *e = open_logged(m, wf, dir, log, sizeof log);
    snprintf(line, sizeof line, "event=weights_cache result=%s ", want);
    if (!strstr(log, line)) fail_msg("expected %s; the log was:\n%s", line, log);
    float *l = logits_of(e);
    assert_memory_equal(l, ref, sizeof(float) * (size_t)dol_engine_vocab_size(e) * N_IDS);
    free(l);
    dol_engine_free(e);
}

static float *reference(const dol_model *m, dol_weight_format wf)
{
    char log[8192];
    dol_engine *e = open_logged(m, wf, NULL, log, sizeof log);
    assert_null(strstr(log, "weights_cache"));
    float *l = logits_of(e);
    dol_engine_free(e);
    return l;
}

static void hit_matches(const char *model, dol_weight_format wf, const char *sub)
{
    char mdir[1200], dir[400], err[DOL_ERR_LEN];
    test_fixture_model(mdir, sizeof mdir, model);
    dol_model *m = NULL;
    if (dol_model_load(mdir, &m, err, sizeof err) != 0) fail_msg("%s", err);
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, sub);
    assert_int_equal(mkdir(dir, 0755), 0);
    float *ref = reference(m, wf);
    start_expect(m, wf, dir, ref, "miss");
    assert_int_equal(cache_files(dir, NULL, 0), 1);
    start_expect(m, wf, dir, ref, "hit");
    start_expect(m, wf, dir, ref, "hit");
    assert_int_equal(cache_files(dir, NULL, 0), 1);
    free(ref);
    dol_model_free(m);
}

static void test_hit_f32(void **s) { (void)s; hit_matches("stories260K", DOL_WEIGHTS_AUTO, "f32"); }
static void test_hit_f16(void **s) { (void)s; hit_matches("stories260K", DOL_WEIGHTS_F16, "f16"); }
static void test_hit_nf4(void **s) { (void)s; hit_matches("stories260K", DOL_WEIGHTS_NF4, "nf4"); }
static void test_hit_int8(void **s) { (void)s; hit_matches("stories260K", DOL_WEIGHTS_INT8, "int8"); }
static void test_hit_shards(void **s) { (void)s; hit_matches("tiny-llama2", DOL_WEIGHTS_NF4, "shards"); }

/* A copy of stories260K under tmpdir (its files may then be touched). */
static void copy_model(char *dst, size_t n)
{
    char src[1200], cmd[3000];
    test_fixture_model(src, sizeof src, "stories260K");
    snprintf(dst, n, "%s/model-copy", tmpdir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dst, src, dst);
    assert_int_equal(system(cmd), 0);
}

/* A checkpoint with a new mtime, or another format: a miss and a new file,
 * never the old one. */
static void test_stale(void **state)
{
    (void)state;
    char mdir[300], dir[400], st_path[400], err[DOL_ERR_LEN];
    copy_model(mdir, sizeof mdir);
    snprintf(dir, sizeof dir, "%s/stale", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    dol_model *m = NULL;
    if (dol_model_load(mdir, &m, err, sizeof err) != 0) fail_msg("%s", err);
    float *ref = reference(m, DOL_WEIGHTS_NF4);
    start_expect(m, DOL_WEIGHTS_NF4, dir, ref, "miss");
    start_expect(m, DOL_WEIGHTS_NF4, dir, ref, "hit");

    /* touch: same bytes, a new modification time */
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", mdir);
    struct timespec ts[2] = { { 0, UTIME_OMIT }, { 1700000000, 123456789 } };
    assert_int_equal(utimensat(AT_FDCWD, st_path, ts, 0), 0);
    start_expect(m, DOL_WEIGHTS_NF4, dir, ref, "miss");
    assert_int_equal(cache_files(dir, NULL, 0), 2);
    start_expect(m, DOL_WEIGHTS_NF4, dir, ref, "hit");

    /* another weights format: its own file */
    float *ref8 = reference(m, DOL_WEIGHTS_INT8);
    start_expect(m, DOL_WEIGHTS_INT8, dir, ref8, "miss");
    assert_int_equal(cache_files(dir, NULL, 0), 3);
    start_expect(m, DOL_WEIGHTS_INT8, dir, ref8, "hit");
    start_expect(m, DOL_WEIGHTS_NF4, dir, ref, "hit");
    free(ref8);
    free(ref);
    dol_model_free(m);
}

/* Overwrite len bytes of path at off (off < 0: from the end). */
static void poke(const char *path, long off, const void *bytes, size_t len)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    if (off < 0) off += (long)lseek(fd, 0, SEEK_END);
    assert_int_equal(pwrite(fd, bytes, len, off), (ssize_t)len);
    close(fd);
}

/* A start over a damaged cache file: one warning naming the file and
 * `reason`, the file rebuilt, the logits still ref; the next start a hit. */
static void expect_rebuilt(const dol_model *m, const char *dir, const char *path,
                           const float *ref, const char *reason)
{
    char log[8192];
    dol_engine *e = open_logged(m, DOL_WEIGHTS_F16, dir, log, sizeof log);
    assert_non_null(strstr(log, "event=weights_cache_invalid"));
    assert_non_null(strstr(log, path));
    assert_non_null(strstr(log, reason));
    assert_non_null(strstr(log, "event=weights_cache result=rebuilt"));
    float *l = logits_of(e);
    assert_memory_equal(l, ref, sizeof(float) * (size_t)dol_engine_vocab_size(e) * N_IDS);
    free(l);
    dol_engine_free(e);
    start_expect(m, DOL_WEIGHTS_F16, dir, ref, "hit");
}

/* A flipped byte in an array, in the table, a bad magic, a truncated
 * file: each detected (one warning naming the file), rebuilt, and the
 * logits still those of the conversion. */
static void test_corrupt(void **state)
{
    (void)state;
    char mdir[1200], dir[400], path[700], err[DOL_ERR_LEN];
    test_fixture_model(mdir, sizeof mdir, "stories260K");
    snprintf(dir, sizeof dir, "%s/corrupt", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    dol_model *m = NULL;
    if (dol_model_load(mdir, &m, err, sizeof err) != 0) fail_msg("%s", err);
    float *ref = reference(m, DOL_WEIGHTS_F16);
    start_expect(m, DOL_WEIGHTS_F16, dir, ref, "miss");
    assert_int_equal(cache_files(dir, path, sizeof path), 1);

    /* the first array starts at 4096 (weights_cache.h); flip one bit */
    int fd = open(path, O_RDONLY);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, 4096), 1);
    close(fd);
    b ^= 0x10;
    poke(path, 4096, &b, 1);
    expect_rebuilt(m, dir, path, ref, "checksum mismatch");

    /* a byte of the tensor table */
    poke(path, 100, "\xff", 1);
    expect_rebuilt(m, dir, path, ref, "reason=");

    /* bad magic */
    poke(path, 0, "NOTDOLPH", 8);
    expect_rebuilt(m, dir, path, ref, "bad magic");

    /* truncated: the last page gone, then all but the header */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size - 4096), 0);
    expect_rebuilt(m, dir, path, ref, "truncated");
    assert_int_equal(truncate(path, 10), 0);
    start_expect(m, DOL_WEIGHTS_F16, dir, ref, "rebuilt");
    start_expect(m, DOL_WEIGHTS_F16, dir, ref, "hit");
    assert_int_equal(cache_files(dir, NULL, 0), 1);
    free(ref);
    dol_model_free(m);
}

/* A folder that cannot be written (a path under a regular file: refused
 * even to root): the start succeeds, with a warning and the right logits. */
static void test_unwritable(void **state)
{
    (void)state;
    char mdir[1200], dir[450], file[400], err[DOL_ERR_LEN];
    test_fixture_model(mdir, sizeof mdir, "stories260K");
    snprintf(file, sizeof file, "%s/plain-file", tmpdir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(dir, sizeof dir, "%s/sub", file);
    dol_model *m = NULL;
    if (dol_model_load(mdir, &m, err, sizeof err) != 0) fail_msg("%s", err);
    float *ref = reference(m, DOL_WEIGHTS_NF4);
    for (int i = 0; i < 2; i++) {
        char log[8192];
        dol_engine *e = open_logged(m, DOL_WEIGHTS_NF4, dir, log, sizeof log);
        assert_non_null(strstr(log, "level=warn event=weights_cache_write_failed"));
        assert_null(strstr(log, "event=weights_cache result="));
        float *l = logits_of(e);
        assert_memory_equal(l, ref, sizeof(float) * (size_t)dol_engine_vocab_size(e) * N_IDS);
        free(l);
        dol_engine_free(e);
    }
    free(ref);
    dol_model_free(m);
}

/* The cache checks its arrays with the kernel sets' XXH3: every set this
 * CPU supports gives libxxhash's value, for every length up to 300 bytes
 * (XXH3's short, medium and block paths), at every alignment, and for
 * long inputs with an odd tail. */
static void test_xxh3_sets(void **state)
{
    (void)state;
    static const char *const sets[] = { "portable", "avx2", "avx512" };
    const size_t big = (1u << 20) + 1234;
    unsigned char *buf = malloc(big + 64);
    assert_non_null(buf);
    for (size_t i = 0; i < big + 64; i++) buf[i] = (unsigned char)(i * 2654435761u >> 13);
    int tried = 0;
    for (int s = 0; s < 3; s++) {
        const dol_cpu_kernels *k = dol_cpu_kernels_find(sets[s]);
        if (!k) continue;
        tried++;
        for (size_t n = 0; n <= 300; n++)
            for (size_t a = 0; a < 8; a++)
                assert_true(k->xxh3(buf + a, n) == XXH3_64bits(buf + a, n));
        const size_t longs[] = { 1024, 4096, 65537, big };
        for (int i = 0; i < 4; i++)
            assert_true(k->xxh3(buf + 3, longs[i]) == XXH3_64bits(buf + 3, longs[i]));
    }
    assert_true(tried >= 1);
    free(buf);
}

int main(void)
{
    dol_log_set_level(DOL_LOG_INFO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_f32),   cmocka_unit_test(test_hit_f16),
        cmocka_unit_test(test_hit_nf4),   cmocka_unit_test(test_hit_int8),
        cmocka_unit_test(test_hit_shards), cmocka_unit_test(test_stale),
        cmocka_unit_test(test_corrupt),   cmocka_unit_test(test_unwritable),
        cmocka_unit_test(test_xxh3_sets),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
