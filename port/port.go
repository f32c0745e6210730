// Package port holds the platform primitives libasync stands on: one poller
// backend per file (epoll+eventfd, poll+pipe, kqueue+pipe, IOCP), each with a
// doorbell that other threads ring to wake the waiting thread.
//
// A Poller is used by exactly one waiting thread at a time (Wait), while Add,
// Modify, Remove, Ring and Wakeup may be called from any thread concurrently.
// fd readiness is level-triggered. Nothing here knows about completions or
// timers: those live in the platform-free core (package libasync).
package port

import (
	"errors"
	"math"
	"os"
	"unsafe"
)

// Event bits, identical to the ASYNC_EVENT_* values of include/async.h.
const (
	EventRead  uint32 = 0x01
	EventWrite uint32 = 0x02
	EventError uint32 = 0x04
	EventClose uint32 = 0x08
)

// Event is one fd readiness report.
type Event struct {
	Fd     int
	Events uint32
}

// Doorbell kinds, telling C code how to ring a doorbell from a signal handler
// without calling Go (see cabi: async_runtime_wakeup).
const (
	// DoorbellEventfd: write an 8-byte counter. Explicit wakeups add
	// WakeupIncrement, internal rings add 1.
	DoorbellEventfd = 1
	// DoorbellPipe: write one byte: WakeupByte for explicit wakeups,
	// RingByte for internal rings.
	DoorbellPipe = 2
)

// Values written to doorbells. An eventfd counter that reads at least
// WakeupIncrement saw an explicit wakeup; a pipe that yields a WakeupByte did.
const (
	WakeupIncrement uint64 = 1 << 32
	RingByte        byte   = 'r'
	WakeupByte      byte   = 'w'
)

// Errors returned by pollers. The core maps them to ASYNC_E_* codes.
var (
	ErrExists   = errors.New("port: fd already registered")
	ErrNotFound = errors.New("port: fd not registered")
	ErrBadFd    = errors.New("port: bad file descriptor")
	ErrClosed   = errors.New("port: poller closed")
	ErrBackend  = errors.New("port: unknown backend")
)

// Poller is a readiness poller with a doorbell.
type Poller interface {
	// Add starts watching fd for events (EventRead|EventWrite|EventClose).
	// Errors and a hang-up of both sides are always reported; a read-side
	// hang-up alone (the peer's shutdown(SHUT_WR)) is EventClose only when
	// EventClose was asked for (data may still be unread). On Unix, Add,
	// Modify and Remove fail with ErrBadFd for a number that cannot name a
	// descriptor (negative or above math.MaxInt32) and leave every
	// registration alone.
	Add(fd int, events uint32) error
	// Modify changes the watched events of a registered fd.
	Modify(fd int, events uint32) error
	// Remove stops watching fd.
	Remove(fd int) error
	// Wait blocks up to timeoutMs (-1 forever, 0 poll) and fills evs with
	// ready fds (the doorbell is never among them), at most MaxHarvest on
	// Unix (the rest come next time). With more ready fds than evs holds,
	// they take turns: on epoll and poll an fd that stays ready is reported
	// within ceil(R/len(evs))+1 Waits (R: the fds ready meanwhile), however
	// other registrations come and go. Any negative timeoutMs is forever; one
	// above math.MaxInt32 waits math.MaxInt32 ms on Unix. r says whether the
	// doorbell was drained, whether that included an explicit Wakeup, and
	// whether a signal interrupted the wait.
	Wait(evs []Event, timeoutMs int) (n int, r WaitResult, err error)
	// Ring wakes the waiter for internal reasons (new work); it is not
	// reported as a wakeup.
	Ring() error
	// Wakeup wakes the waiter and is reported as woken.
	Wakeup() error
	// Doorbell describes the descriptor C code writes to ring the doorbell.
	Doorbell() (fd int, kind int)
	// Name is the backend's name ("epoll", "poll", ...).
	Name() string
	// Close releases the poller's descriptors. Registered fds are left open.
	Close() error
}

// RawPoller is implemented by pollers whose blocking wait foreign code can do
// by itself: C code calls the platform's wait (epoll_wait on Linux) on RawFD,
// into a buffer of RawEventSize-byte records, outside Go, and hands what it
// got to ConsumeRaw, which does what Wait does with the kernel's answer.
type RawPoller interface {
	RawFD() int
	RawEventSize() int
	// ConsumeRaw translates n raw records at raw into evs (ignoring what
	// does not fit: readiness is level-triggered) and drains the doorbell.
	ConsumeRaw(raw unsafe.Pointer, n int, evs []Event) (int, WaitResult)
}

// WaitResult says what else than fd events a Wait saw.
type WaitResult struct {
	Woken       bool // an explicit Wakeup was drained
	Rung        bool // the doorbell was drained (ring or wakeup)
	Interrupted bool // the wait was interrupted by a signal (EINTR)
}

// New returns the platform's default poller, or the one named by the
// ASYNC_BACKEND environment variable ("epoll", "poll", "kqueue", "iocp").
func New() (Poller, error) {
	return NewNamed(os.Getenv("ASYNC_BACKEND"))
}

// NewNamed returns the named backend; "" means the platform default.
func NewNamed(name string) (Poller, error) {
	if name == "" {
		name = defaultBackend
	}
	ctor, ok := backends[name]
	if !ok {
		return nil, ErrBackend
	}
	return ctor()
}

// Backends lists the backend names available on this platform.
func Backends() []string {
	names := make([]string, 0, len(backends))
	for n := range backends {
		names = append(names, n)
	}
	return names
}

// badFdNumber reports whether fd cannot name a descriptor of a Unix
// poller: negative, or beyond the kernel's int. The syscalls (epoll_ctl,
// fstat, fcntl, kevent's ident, poll's int32 field) keep only the low 32
// bits, so such a number must be refused before it reaches them: fd + 2^32
// would name fd itself, and Add, Modify or Remove of it would touch fd's
// registration.
func badFdNumber(fd int) bool { return fd < 0 || int64(fd) > math.MaxInt32 }

var backends = map[string]func() (Poller, error){}

func register(name string, ctor func() (Poller, error)) { backends[name] = ctor }
