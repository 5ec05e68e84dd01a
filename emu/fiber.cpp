/* emu/fiber.cpp — context switching for the CUDA emulation's fibers (see
 * fiber.h): a hand-written x86-64 switch that saves only what the SysV ABI
 * says a callee preserves, and the portable but slow ucontext (its
 * swapcontext makes a sigprocmask system call per switch) as the fallback.
 * AddressSanitizer is told about every stack change. */
#include "fiber.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define DOL_FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DOL_FIBER_ASAN 1
#endif
#endif

#ifdef DOL_FIBER_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__) && !defined(DOL_FIBER_UCONTEXT_ONLY)
#define DOL_FIBER_HAVE_FAST 1
/* dol_fiber_swap(save, next): push rbp, rbx, r12-r15, store rsp in *save,
 * load next as rsp, pop the same registers and return on the new stack. */
extern "C" void dol_fiber_swap(void **save, void *next);
__asm__(".text\n"
        ".globl dol_fiber_swap\n"
        ".type dol_fiber_swap,@function\n"
        "dol_fiber_swap:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size dol_fiber_swap,.-dol_fiber_swap\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");
#endif

static int g_fast = -1;

bool dol_fiber_fast(void)
{
    if (g_fast < 0) {
#ifdef DOL_FIBER_HAVE_FAST
        const char *u = getenv("DOLPHIN_CUDA_EMU_UCONTEXT");
        g_fast = !(u && strcmp(u, "1") == 0);
#else
        g_fast = 0;
#endif
    }
    return g_fast == 1;
}

void dol_fiber_prepare(dol_fiber *f, void (*entry)(void))
{
#ifdef DOL_FIBER_ASAN
    /* the frames a fiber abandons when it ends keep their redzones poisoned;
     * clear them before the stack is used again */
    if (f->dead_low) {
        char *top = f->stack + f->stack_size;
        __asan_unpoison_memory_region(f->dead_low, (size_t)(top - f->dead_low));
        f->dead_low = NULL;
    }
#endif
#ifdef DOL_FIBER_HAVE_FAST
    if (dol_fiber_fast()) {
        /* the frame dol_fiber_swap pops: six registers (zero), then the
         * return address = entry, which starts with rsp % 16 == 8 as after
         * a call; a zero return address above it ends backtraces */
        uintptr_t top = ((uintptr_t)f->stack + f->stack_size) & ~(uintptr_t)15;
        void **sp = (void **)(top - 64);
        memset(sp, 0, 64);
        sp[6] = (void *)entry;
        f->sp = sp;
        return;
    }
#endif
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = f->stack_size;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, entry, 0);
}

void dol_fiber_switch(dol_fiber *from, dol_fiber *to, bool dying)
{
#ifdef DOL_FIBER_ASAN
    if (dying) {
        char *low = (char *)__builtin_frame_address(0) - 512; /* this frame and the switch's */
        from->dead_low = low > from->stack ? low : from->stack;
    }
    __sanitizer_start_switch_fiber(dying ? NULL : &from->asan_fake, to->stack, to->stack_size);
#else
    (void)dying;
#endif
#ifdef DOL_FIBER_HAVE_FAST
    if (dol_fiber_fast())
        dol_fiber_swap(&from->sp, to->sp);
    else
#endif
        swapcontext(&from->uc, &to->uc);
#ifdef DOL_FIBER_ASAN
    const void *bottom = NULL;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(from->asan_fake, &bottom, &size);
#endif
}

void dol_fiber_started(dol_fiber *self)
{
    (void)self;
#ifdef DOL_FIBER_ASAN
    __sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
}
