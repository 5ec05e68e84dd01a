/* tests/fuzz/fuzz_util.h — small helpers shared by the libFuzzer targets:
 * an independent strict UTF-8 check (used as an oracle against the code
 * under test), a loud invariant check, and an in-memory file (memfd) for
 * the parsers that take a path. Header-only; each target includes it once. */
#ifndef DOLPHIN_FUZZ_UTIL_H
#define DOLPHIN_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* An invariant of the code under test does not hold: say which, then abort
 * so that libFuzzer records the input as a crash. */
#define FUZZ_CHECK(cond)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__,         \
                    __LINE__, #cond);                                          \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* Well-formed UTF-8 per the Unicode standard's table of byte sequences
 * (no overlongs, no surrogates, nothing past U+10FFFF). Written from the
 * table, independently of the project's own checks. */
static inline bool fuzz_utf8_ok(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        unsigned lo = 0x80, hi = 0xBF;
        size_t len;
        if (c <= 0x7F) { i++; continue; }
        else if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c == 0xE0) { len = 3; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) len = 3;
        else if (c == 0xED) { len = 3; hi = 0x9F; }
        else if (c >= 0xEE && c <= 0xEF) len = 3;
        else if (c == 0xF0) { len = 4; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) len = 4;
        else if (c == 0xF4) { len = 4; hi = 0x8F; }
        else return false;
        if (n - i < len) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return false;
        i += len;
    }
    return true;
}

/* An anonymous in-memory file reachable by path (/proc/self/fd/N), so
 * that parsers which open a path never touch the disk. */
typedef struct {
    int fd;
    char path[64];
} fuzz_memfile;

static inline void fuzz_memfile_init(fuzz_memfile *m, const char *name)
{
    m->fd = memfd_create(name, MFD_CLOEXEC);
    if (m->fd < 0) {
        perror("memfd_create");
        exit(1);
    }
    snprintf(m->path, sizeof m->path, "/proc/self/fd/%d", m->fd);
}

/* Replace the file's contents with data[0..size). */
static inline void fuzz_memfile_set(fuzz_memfile *m, const uint8_t *data, size_t size)
{
    if (ftruncate(m->fd, 0) != 0 || (size && pwrite(m->fd, data, size, 0) != (ssize_t)size)) {
        perror("memfd write");
        exit(1);
    }
}

#endif
