/* The symbol macros of the POSIX context switches (switch_amd64.S,
 * switch_arm64.S), for the object formats: ELF (Linux, the BSDs) wants
 * .type/.size (and the non-executable-stack note, which each file emits
 * with its architecture's section-type syntax); Mach-O (darwin) has neither
 * and prefixes C symbols with an underscore. %function is the type syntax
 * both x86-64 and AArch64 assemblers accept ('@' starts a comment on ARM).
 * Only for the assembler. Not installed. */
#ifndef LA_SWITCH_SYM_H
#define LA_SWITCH_SYM_H
#if defined(__APPLE__)
#define LA_SYM(x) _##x
#define LA_FUNC(x)
#define LA_END(x)
#else
#define LA_SYM(x) x
#define LA_FUNC(x) .type x, %function
#define LA_END(x) .size x, .-x
#endif
#endif
