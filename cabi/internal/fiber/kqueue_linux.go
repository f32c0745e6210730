//go:build la_kqueue

package fiber

// With -tags la_kqueue the Linux build uses the kqueue fiber poller
// (poller_kqueue.c) on libkqueue's emulation instead of poller_epoll.c, so
// that Linux can run the darwin/BSD poller's logic. Untested: Debian 12 has
// no libkqueue-dev (see docs/PLATFORMS.md).

/*
#cgo CFLAGS: -DLA_FIBER_KQUEUE -I/usr/include/kqueue
#cgo LDFLAGS: -lkqueue
*/
import "C"
