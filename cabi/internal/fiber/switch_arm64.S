//go:build !windows

/* Fiber context switch for AArch64 (AAPCS64). See fiber.h.
 *   void la_ctx_switch(void **save, void *to)
 * Saves x19-x30, d8-d15 and FPCR in a 176-byte frame on the current stack,
 * stores sp in *save, switches to `to` and restores the same set. A fresh
 * stack (la_ctx_make) "returns" (x30) into la_ctx_trampoline with the fiber
 * pointer in x19. x18 (the platform register, reserved on darwin) is never
 * touched. */

#include "switch_sym.h" /* LA_SYM, LA_FUNC, LA_END */

        .text
        .globl  LA_SYM(la_ctx_switch)
        LA_FUNC(la_ctx_switch)
        .p2align 4
LA_SYM(la_ctx_switch):
        sub     sp, sp, #176
        stp     x19, x20, [sp, #0]
        stp     x21, x22, [sp, #16]
        stp     x23, x24, [sp, #32]
        stp     x25, x26, [sp, #48]
        stp     x27, x28, [sp, #64]
        stp     x29, x30, [sp, #80]
        stp     d8, d9, [sp, #96]
        stp     d10, d11, [sp, #112]
        stp     d12, d13, [sp, #128]
        stp     d14, d15, [sp, #144]
        mrs     x9, fpcr
        str     x9, [sp, #160]
        mov     x9, sp
        str     x9, [x0]
        mov     sp, x1
        ldp     x19, x20, [sp, #0]
        ldp     x21, x22, [sp, #16]
        ldp     x23, x24, [sp, #32]
        ldp     x25, x26, [sp, #48]
        ldp     x27, x28, [sp, #64]
        ldp     x29, x30, [sp, #80]
        ldp     d8, d9, [sp, #96]
        ldp     d10, d11, [sp, #112]
        ldp     d12, d13, [sp, #128]
        ldp     d14, d15, [sp, #144]
        ldr     x9, [sp, #160]
        msr     fpcr, x9
        add     sp, sp, #176
        ret
        LA_END(la_ctx_switch)

        .globl  LA_SYM(la_ctx_trampoline)
        LA_FUNC(la_ctx_trampoline)
        .p2align 4
LA_SYM(la_ctx_trampoline):
        .cfi_startproc
        .cfi_undefined x30      // the outermost frame of a fiber: debuggers stop here
        mov     x29, #0
        mov     x0, x19
        bl      LA_SYM(la_fiber_main)
        brk     #0
        .cfi_endproc
        LA_END(la_ctx_trampoline)

#if defined(__ELF__)
        .section .note.GNU-stack,"",%progbits
#endif
