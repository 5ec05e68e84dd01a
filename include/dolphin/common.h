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

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

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

#ifdef __cplusplus
}
#endif
#endif
