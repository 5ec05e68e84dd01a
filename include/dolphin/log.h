/* include/dolphin/log.h — structured logs: one line per event on stderr,
 * key=value pairs ("ts=2026-11-30T03:40:51.123Z level=info event=start
 * port=8080"). Thread-safe (one write(2) per line). */
#ifndef DOLPHIN_LOG_H
#define DOLPHIN_LOG_H

#include "dolphin/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DOL_LOG_DEBUG = 0, DOL_LOG_INFO, DOL_LOG_WARN, DOL_LOG_ERROR } dol_log_level;

/* Minimum level printed; parse "debug|info|warn|error" (-1 if unknown). */
void dol_log_set_level(dol_log_level l);
int dol_log_parse_level(const char *s);

/* Log `event` with the key=value pairs formatted by fmt (printf style, may
 * be NULL or ""). Values with spaces or quotes should be passed through
 * dol_log_quote (DOL_LOG_Q); control bytes that still reach the pairs (a
 * newline in an unquoted value) are written escaped (\n, \xNN), so an event
 * is always one line. Any thread. */
void dol_log(dol_log_level l, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Quote a value for key=value output when it needs it ("a b" -> "\"a b\"");
 * writes into buf (size n) and returns buf. */
const char *dol_log_quote(const char *s, char *buf, size_t n);

/* dol_log_quote into a 1 KiB buffer that lives to the end of the enclosing
 * block (a compound literal), for a value passed straight to dol_log:
 * dol_log(l, "ev", "model=%s", DOL_LOG_Q(name)). Longer values are cut. */
#define DOL_LOG_Q(s) dol_log_quote((s), (char[1024]){ 0 }, 1024)

#ifdef __cplusplus
}
#endif
#endif
