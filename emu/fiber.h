/* emu/fiber.h — the context switch under the CUDA emulation's threads: each
 * emulated GPU thread is a fiber on its own stack, switched on one OS thread.
 * A small x86-64 switch (callee-saved registers and the stack pointer) where
 * available, ucontext elsewhere or with DOLPHIN_CUDA_EMU_UCONTEXT=1. */
#ifndef DOLPHIN_EMU_FIBER_H
#define DOLPHIN_EMU_FIBER_H

#include <stddef.h>

#include <ucontext.h>

struct dol_fiber {
    void *sp;          /* saved stack pointer (fast switch) */
    ucontext_t uc;     /* saved context (ucontext fallback) */
    char *stack;       /* lowest address of the usable stack */
    size_t stack_size;
    void *asan_fake;   /* AddressSanitizer's fake stack while switched away */
    char *dead_low;    /* lowest address of the frames abandoned when it last ended */
};

/* Whether the fast switch is in use (decided once, from the environment). */
bool dol_fiber_fast(void);
/* Prepare f to run entry() on its stack at the next switch to it; entry must
 * never return (it switches away for the last time instead). */
void dol_fiber_prepare(dol_fiber *f, void (*entry)(void));
/* Save the current context into from and resume to. from_stack/size name the
 * stack being left, to's bounds come from `to` (for AddressSanitizer);
 * `dying` says the fiber being left will never run again. */
void dol_fiber_switch(dol_fiber *from, dol_fiber *to, bool dying);
/* Called first thing in a fiber's entry (AddressSanitizer bookkeeping). */
void dol_fiber_started(dol_fiber *self);

#endif
