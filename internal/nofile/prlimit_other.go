//go:build !(linux && (amd64 || arm64))

package nofile

const supported = false

func prlimit(resource int, newp, oldp *rlimit) int { return -1 }
