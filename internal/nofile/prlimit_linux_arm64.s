#include "textflag.h"

// func prlimit(resource int, newp, oldp *rlimit) int
TEXT ·prlimit(SB),NOSPLIT,$0-32
	MOVD	$0, R0                 // pid 0: this process
	MOVD	resource+0(FP), R1
	MOVD	newp+8(FP), R2
	MOVD	oldp+16(FP), R3
	MOVD	$261, R8               // SYS_prlimit64
	SVC
	MOVD	R0, ret+24(FP)
	RET
