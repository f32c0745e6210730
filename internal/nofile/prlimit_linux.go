//go:build linux && (amd64 || arm64)

package nofile

const supported = true

// prlimit is prlimit64(0, resource, newp, oldp): 0, or -errno. Raw, in
// assembly: this package may import nothing (see the package comment).
//
//go:noescape
func prlimit(resource int, newp, oldp *rlimit) int
