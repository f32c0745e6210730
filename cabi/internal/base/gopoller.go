package base

import "time"

// Go's runtime starts its own network poller (on Linux an epoll descriptor
// and an eventfd) lazily, with the first timer in its heap. The garbage
// collector's scavenger sets such a timer after a collection, so a host that
// runs at its RLIMIT_NOFILE limit could see the process abort long after
// every libasync call had returned ("runtime: netpollinit failed"): Go
// cannot fail that step softly. Package init runs when the library is
// loaded, while descriptors are free: start the poller here, once.
func init() {
	time.AfterFunc(time.Hour, func() {}).Stop()
}
