#include "textflag.h"

// func prlimit(resource int, newp, oldp *rlimit) int
TEXT ·prlimit(SB),NOSPLIT,$0-32
	MOVQ	$0, DI                 // pid 0: this process
	MOVQ	resource+0(FP), SI
	MOVQ	newp+8(FP), DX
	MOVQ	oldp+16(FP), R10
	MOVQ	$302, AX               // SYS_prlimit64
	SYSCALL
	MOVQ	AX, ret+24(FP)
	RET
