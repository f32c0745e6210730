//go:build windows && amd64

/* Fiber context switch for x86-64 Windows (Microsoft x64 ABI). See fiber.h.
 *   void la_ctx_switch(void **save, void *to)      save in rcx, to in rdx
 * Saves on the current stack everything the Windows x64 ABI makes callee-saved
 * (rbp, rbx, rdi, rsi, r12-r15, xmm6-xmm15, MXCSR, the x87 control word) and
 * the stack fields of the thread's TIB that Windows reads on this thread
 * (StackBase gs:0x08, StackLimit gs:0x10, DeallocationStack gs:0x1478,
 * GuaranteedStackBytes gs:0x1748): exception dispatch and unwinding check
 * frames against StackBase/StackLimit, and the kernel (and wine) grow a stack
 * and raise EXCEPTION_STACK_OVERFLOW from DeallocationStack and
 * GuaranteedStackBytes. Stores the stack pointer in *save, switches to `to`
 * and restores the same set from there. x64 has no ExceptionList (SEH is
 * table-based) and these fibers use no FiberData / fiber-local storage.
 *
 * Frame (from the saved stack pointer up):
 *   0 MXCSR, 4 x87 CW | 8 GuaranteedStackBytes | 16 StackBase | 24 StackLimit
 *   | 32 DeallocationStack | 40..199 xmm6..xmm15 | 200 r15 r14 r13 r12 rsi
 *   rdi rbx rbp | 264 return address
 * la_ctx_make_win64 (stacks_windows.c) builds one on a fresh stack whose
 * return address is la_ctx_trampoline, with the fiber pointer in r12. */
        .text
        .globl  la_ctx_switch
        .def    la_ctx_switch; .scl 2; .type 32; .endef
        .p2align 4
la_ctx_switch:
        pushq   %rbp
        pushq   %rbx
        pushq   %rdi
        pushq   %rsi
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        subq    $200, %rsp
        movups  %xmm6, 40(%rsp)
        movups  %xmm7, 56(%rsp)
        movups  %xmm8, 72(%rsp)
        movups  %xmm9, 88(%rsp)
        movups  %xmm10, 104(%rsp)
        movups  %xmm11, 120(%rsp)
        movups  %xmm12, 136(%rsp)
        movups  %xmm13, 152(%rsp)
        movups  %xmm14, 168(%rsp)
        movups  %xmm15, 184(%rsp)
        movq    %gs:0x1478, %rax
        movq    %rax, 32(%rsp)
        movq    %gs:0x10, %rax
        movq    %rax, 24(%rsp)
        movq    %gs:0x08, %rax
        movq    %rax, 16(%rsp)
        movl    %gs:0x1748, %eax
        movq    %rax, 8(%rsp)
        stmxcsr (%rsp)
        fnstcw  4(%rsp)
        movq    %rsp, (%rcx)

        movq    %rdx, %rsp
        ldmxcsr (%rsp)
        fldcw   4(%rsp)
        movq    8(%rsp), %rax
        movl    %eax, %gs:0x1748
        movq    16(%rsp), %rax
        movq    %rax, %gs:0x08
        movq    24(%rsp), %rax
        movq    %rax, %gs:0x10
        movq    32(%rsp), %rax
        movq    %rax, %gs:0x1478
        movups  40(%rsp), %xmm6
        movups  56(%rsp), %xmm7
        movups  72(%rsp), %xmm8
        movups  88(%rsp), %xmm9
        movups  104(%rsp), %xmm10
        movups  120(%rsp), %xmm11
        movups  136(%rsp), %xmm12
        movups  152(%rsp), %xmm13
        movups  168(%rsp), %xmm14
        movups  184(%rsp), %xmm15
        addq    $200, %rsp
        popq    %r15
        popq    %r14
        popq    %r13
        popq    %r12
        popq    %rsi
        popq    %rdi
        popq    %rbx
        popq    %rbp
        ret

/* A new fiber's first code. Entered by la_ctx_switch's ret with rsp at a
 * zero word (a fake return address, so a stack walk ends here) and rsp = 8
 * mod 16, like a called function; reserves the callee's 32-byte shadow space
 * (plus 8 to align the call) and calls la_fiber_main(fiber), which never
 * returns. The unwind data says exactly that. */
        .globl  la_ctx_trampoline
        .def    la_ctx_trampoline; .scl 2; .type 32; .endef
        .p2align 4
        .seh_proc la_ctx_trampoline
la_ctx_trampoline:
        subq    $40, %rsp
        .seh_stackalloc 40
        .seh_endprologue
        movq    %r12, %rcx
        call    la_fiber_main
        ud2
        .seh_endproc
