/* include/dolphin/common.h — types and conventions shared by every Dolphin
 * module: the error-buffer convention and a few size helpers.
 *
 * Error convention: functions that can fail return 0 on success and -1 on
 * failure, and write one human-readable line (no trailing newline) into a
 * caller-supplied buffer `err` of `errlen` bytes (DOL_ERR_LEN is enough).
 * The line names the file and the field/tensor at fault where there is one.
 */
#ifndef DOLPHIN_COMMON_H
#define DOLPHIN_COMMON_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <time.h>

#define DOL_ERR_LEN 512

#ifdef __cplusplus
extern "C" {
#endif

/* printf-style write into an error buffer; safe with err == NULL. */
void dol_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Monotonic clock in milliseconds / nanoseconds (CLOCK_MONOTONIC). */
double dol_now_ms(void);
uint64_t dol_now_ns(void);

/* Timed waits on CLOCK_MONOTONIC, so that a change of the wall clock
 * neither stretches nor cuts them: dol_cond_init makes a condition variable
 * whose pthread_cond_timedwait deadlines are monotonic, dol_deadline_ms the
 * deadline `ms` milliseconds from now on that clock. 0 or an errno. */
int dol_cond_init(pthread_cond_t *cv);
struct timespec dol_deadline_ms(double ms);

#ifdef __cplusplus
}
#endif
#endif
