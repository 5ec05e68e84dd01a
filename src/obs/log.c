/* src/obs/log.c — the structured logger of include/dolphin/log.h: one
 * key=value line per event on stderr ("ts=… level=… event=… k=v …"), the
 * minimum level, and quoting of values. Each line goes out in one write(2),
 * so lines from different threads never interleave.
 */
#include "dolphin/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int g_level = DOL_LOG_INFO;

static const char *const LEVEL_NAMES[] = { "debug", "info", "warn", "error" };

void dol_log_set_level(dol_log_level l)
{
    atomic_store_explicit(&g_level, (int)l, memory_order_relaxed);
}

int dol_log_parse_level(const char *s)
{
    if (!s) return -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(s, LEVEL_NAMES[i]) == 0) return i;
    if (strcmp(s, "warning") == 0) return DOL_LOG_WARN;
    return -1;
}

static bool needs_quotes(const char *s)
{
    if (!*s) return true; /* key="" rather than a bare key= */
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p <= ' ' || *p == 0x7f || *p == '"' || *p == '=' || *p == '\\') return true;
    return false;
}

const char *dol_log_quote(const char *s, char *buf, size_t n)
{
    if (!buf || n == 0) return "";
    if (!s) s = "";
    if (!needs_quotes(s)) {
        snprintf(buf, n, "%s", s);
        return buf;
    }
    if (n < 3) { buf[0] = '\0'; return buf; }
    size_t o = 0;
    buf[o++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"':  strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        default:
            if (*p < ' ' || *p == 0x7f) snprintf(esc, sizeof esc, "\\x%02x", *p);
            else { esc[0] = (char)*p; esc[1] = '\0'; }
        }
        size_t el = strlen(esc);
        if (o + el + 2 > n) break; /* keep room for the closing quote and NUL */
        memcpy(buf + o, esc, el);
        o += el;
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

static void write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return;
        }
        p += w;
        len -= (size_t)w;
    }
}

void dol_log(dol_log_level l, const char *event, const char *fmt, ...)
{
    if ((int)l < atomic_load_explicit(&g_level, memory_order_relaxed)) return;
    int saved_errno = errno; /* logging must not disturb the caller's errno */
    if ((int)l < DOL_LOG_DEBUG || (int)l > DOL_LOG_ERROR) l = DOL_LOG_ERROR;

    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);

    char qev[128];
    char head[256];
    int hn = snprintf(head, sizeof head, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s event=%s",
                      tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                      tm.tm_sec, ts.tv_nsec / 1000000L, LEVEL_NAMES[l],
                      dol_log_quote(event ? event : "-", qev, sizeof qev));
    size_t headlen = hn < 0 ? 0 : (size_t)hn < sizeof head ? (size_t)hn : sizeof head - 1;

    /* Size the pairs, then build the whole line in one buffer. */
    int pn = 0;
    va_list ap;
    if (fmt && *fmt) {
        va_start(ap, fmt);
        pn = vsnprintf(NULL, 0, fmt, ap);
        va_end(ap);
        if (pn < 0) pn = 0;
    }
    char stack[2048];
    size_t cap = headlen + (pn ? 1 + (size_t)pn : 0) + 2;
    char *line = cap <= sizeof stack ? stack : malloc(cap);
    if (!line) { line = stack; cap = sizeof stack; }

    size_t len = headlen < cap - 2 ? headlen : cap - 2;
    memcpy(line, head, len);
    if (pn) {
        line[len++] = ' ';
        va_start(ap, fmt);
        vsnprintf(line + len, cap - len - 1, fmt, ap);
        va_end(ap);
        len += strlen(line + len);
    }
    /* one event, one line: a control byte a value brought in unquoted (a
     * newline in a name) is written escaped, as dol_log_quote would */
    size_t n_ctl = 0;
    for (size_t i = headlen; i < len; i++)
        n_ctl += (unsigned char)line[i] < ' ' || line[i] == 0x7f;
    char *esc = n_ctl ? malloc(len + 3 * n_ctl + 1) : NULL;
    if (esc) {
        size_t o = headlen;
        memcpy(esc, line, headlen);
        for (size_t i = headlen; i < len; i++) {
            unsigned char ch = (unsigned char)line[i];
            if (ch == '\n' || ch == '\r' || ch == '\t') {
                esc[o++] = '\\';
                esc[o++] = ch == '\n' ? 'n' : ch == '\r' ? 'r' : 't';
            } else if (ch < ' ' || ch == 0x7f) {
                o += (size_t)sprintf(esc + o, "\\x%02x", ch);
            } else {
                esc[o++] = (char)ch;
            }
        }
        if (line != stack) free(line);
        line = esc;
        len = o;
    } else if (n_ctl) {
        for (size_t i = headlen; i < len; i++)
            if ((unsigned char)line[i] < ' ' || line[i] == 0x7f) line[i] = '?';
    }
    line[len++] = '\n';
    write_all(STDERR_FILENO, line, len);

    if (line != stack) free(line);
    errno = saved_errno;
}
