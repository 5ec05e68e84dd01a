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

int dol_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    int rc = pthread_condattr_init(&a);
    if (rc) return rc;
    rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (!rc) rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

struct timespec dol_deadline_ms(double ms)
{
    uint64_t t = dol_now_ns() + (uint64_t)(ms > 0 ? ms * 1e6 : 0);
    return (struct timespec){.tv_sec = (time_t)(t / 1000000000ull),
                             .tv_nsec = (long)(t % 1000000000ull)};
}
