//go:build unix && !linux && !darwin && !freebsd && !netbsd && !openbsd && !dragonfly

package port

// defaultBackend on unix systems without epoll or kqueue (AIX, Solaris,
// illumos, ...): poll+pipe.
const defaultBackend = "poll"
