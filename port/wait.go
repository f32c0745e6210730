package port

import (
	"math"
	"syscall"
)

// The parts every backend's Wait shares. A Wait clamps its timeout to what
// the kernel takes (waitMs), sizes its raw buffer for at most MaxHarvest
// fds (rawBuf), answers a failed kernel wait the same way (waitFailed), and
// fills the caller's evs through a harvest, which also records what the
// doorbell held. The kernel call, its records and the registrations behind
// them are each backend's own.

// MaxHarvest bounds the fd records one Wait of a Unix poller harvests,
// whatever len(evs): epoll_wait refuses more than INT_MAX/12, and the raw
// buffer must not follow a caller's huge evs (gigabytes). Readiness is
// level-triggered: the records not harvested now are harvested by the next
// Wait.
const MaxHarvest = 1 << 16

// waitMs is a Wait's timeoutMs as the kernel's int takes it: negative is
// -1 (forever), above math.MaxInt32 is math.MaxInt32 (about 24.8 days; Wait
// may return early, with nothing). epoll_pwait and kevent keep only the low
// 32 bits of a wider value, and poll's ms*1e6 must not overflow.
func waitMs(ms int) int {
	if ms < 0 {
		return -1
	}
	if int64(ms) > math.MaxInt32 {
		return math.MaxInt32
	}
	return ms
}

// rawBuf returns *buf resized to hold the kernel's records for one Wait
// into evs: perFd records for each of at most MaxHarvest fds, and extra
// more (the doorbell's). *buf grows only when it is too small, so its size
// follows the bound, never a huge evs.
func rawBuf[T any](buf *[]T, evs []Event, perFd, extra int) []T {
	want := perFd*min(len(evs), MaxHarvest) + extra
	if cap(*buf) < want {
		*buf = make([]T, want)
	}
	return (*buf)[:want]
}

// waitFailed is Wait's answer to a failed kernel wait: EINTR is a wait
// interrupted by a signal, not an error (the caller decides whether to wait
// again); an error listed in closed means the poller's own descriptor is
// gone: ErrClosed. Anything else is returned as it is.
func waitFailed(err error, closed ...error) (int, WaitResult, error) {
	if err == syscall.EINTR {
		return 0, WaitResult{Interrupted: true}, nil
	}
	for _, c := range closed {
		if err == c {
			return 0, WaitResult{}, ErrClosed
		}
	}
	return 0, WaitResult{}, err
}

// harvest is one Wait's output: evs filled from the front, and what the
// doorbell held.
type harvest struct {
	evs []Event
	n   int // events in evs[:n]
	r   WaitResult
}

// full reports whether evs has no room left.
func (h *harvest) full() bool { return h.n == len(h.evs) }

// add reports fd's events if evs has room, and says whether it had. What
// does not fit is reported by a later Wait: readiness is level-triggered.
func (h *harvest) add(fd int, events uint32) bool {
	if h.full() {
		return false
	}
	h.evs[h.n] = Event{Fd: fd, Events: events}
	h.n++
	return true
}

// rang records a drained doorbell; woken: it held an explicit Wakeup.
func (h *harvest) rang(woken bool) {
	h.r.Rung = true
	if woken {
		h.r.Woken = true
	}
}

// result is Wait's answer for what was harvested.
func (h *harvest) result() (int, WaitResult, error) { return h.n, h.r, nil }
