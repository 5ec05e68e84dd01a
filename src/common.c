/* src/common.c — the small helpers declared in include/dolphin/common.h:
 * error-buffer formatting and monotonic clocks. */
#include "dolphin/common.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

void dol_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

uint64_t dol_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double dol_now_ms(void) { return (double)dol_now_ns() / 1e6; }
