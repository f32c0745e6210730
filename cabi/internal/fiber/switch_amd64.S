//go:build !windows

/* Fiber context switch for x86-64 (System V). See fiber.h.
 *   void la_ctx_switch(void **save, void *to)
 * Saves rbp, rbx, r12-r15, MXCSR and the x87 control word on the current
 * stack, stores the stack pointer in *save, switches to `to` and restores the
 * same set from there. A fresh stack (la_ctx_make) "returns" into
 * la_ctx_trampoline with the fiber pointer in r12. */

#include "switch_sym.h" /* LA_SYM, LA_FUNC, LA_END */

        .text
        .globl  LA_SYM(la_ctx_switch)
        LA_FUNC(la_ctx_switch)
        .p2align 4
LA_SYM(la_ctx_switch):
        .cfi_startproc
        pushq   %rbp
        pushq   %rbx
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        subq    $8, %rsp
        stmxcsr (%rsp)
        fnstcw  4(%rsp)
        movq    %rsp, (%rdi)
        movq    %rsi, %rsp
        ldmxcsr (%rsp)
        fldcw   4(%rsp)
        addq    $8, %rsp
        popq    %r15
        popq    %r14
        popq    %r13
        popq    %r12
        popq    %rbx
        popq    %rbp
        ret
        .cfi_endproc
        LA_END(la_ctx_switch)

        .globl  LA_SYM(la_ctx_trampoline)
        LA_FUNC(la_ctx_trampoline)
        .p2align 4
LA_SYM(la_ctx_trampoline):
        .cfi_startproc
        .cfi_undefined rip
        xorl    %ebp, %ebp
        movq    %r12, %rdi
        andq    $-16, %rsp
        call    LA_SYM(la_fiber_main)
        ud2
        .cfi_endproc
        LA_END(la_ctx_trampoline)

#if defined(__ELF__)
        .section .note.GNU-stack,"",@progbits
#endif
