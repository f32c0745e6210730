//go:build linux

package libasync

// Tests of the runtime that need Linux: pipes made with pipe2, the
// epoll-specific fate of a closed registration, /proc/self/fd, and
// MAP_NORESERVE memory for a huge event buffer. Every wait is bounded
// (testLimit): a hang fails.

import (
	"errors"
	"fmt"
	"math"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/libasync/libasync/port"
	"golang.org/x/sys/unix"
)

// testPipe makes a non-blocking pipe closed when the test ends.
func testPipe(t *testing.T) (r, w int) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1]
}

// An fd number beyond the kernel's int (fd + 2^32, fd - 2^32, MaxInt) names
// no descriptor, though its low 32 bits name fd: Add, Modify and Remove of
// it are ErrBadFd, and fd's own registration keeps reporting its events
// with its context.
func TestFdNumberBeyondInt32IsBadFd(t *testing.T) {
	if math.MaxInt == math.MaxInt32 {
		t.Skip("32-bit int")
	}
	backends(t, func(t *testing.T, rt *Runtime) {
		r, w := testPipe(t)
		if err := rt.Add(r, EventRead, 7); err != nil {
			t.Fatal(err)
		}
		for _, huge := range []int{r + 1<<32, r - 1<<32, math.MaxInt, 1 << 31} {
			if err := rt.Add(huge, EventRead, 8); !errors.Is(err, ErrBadFd) {
				t.Errorf("Add(%d): %v, want ErrBadFd", huge, err)
			}
			if err := rt.Modify(huge, EventWrite); !errors.Is(err, ErrBadFd) {
				t.Errorf("Modify(%d): %v, want ErrBadFd", huge, err)
			}
			if err := rt.Remove(huge); !errors.Is(err, ErrBadFd) {
				t.Errorf("Remove(%d): %v, want ErrBadFd", huge, err)
			}
		}
		unix.Write(w, []byte("x"))
		ev := make([]Event, 8)
		n, err := rt.Wait(ev, 2*time.Second) // ready at once: no need to wait longer
		if err != nil || n != 1 || ev[0].Fd != r || ev[0].Context != 7 || ev[0].Type&EventRead == 0 {
			t.Fatalf("after the bad calls: n=%d err=%v ev=%+v (want one read event of fd %d ctx 7)", n, err, ev[:n], r)
		}
		if err := rt.Remove(r); err != nil {
			t.Fatalf("Remove(%d): %v", r, err)
		}
	})
}

// Close racing every Runtime method, on each backend: no panic, no hang, no
// ErrClosed before Close, and afterwards every method says ErrClosed.
func TestRuntimeCloseRacingEveryMethod(t *testing.T) {
	for _, name := range port.Backends() {
		t.Run(name, func(t *testing.T) {
			for round := 0; round < 30; round++ {
				p, err := port.NewNamed(name)
				if err != nil {
					t.Fatal(err)
				}
				rt := NewRuntimeWith(p)
				r, _ := testPipe(t)
				// Close waits for the waiter to leave, so no Wait(-1) can
				// sleep past it: every caller still trying sees ErrClosed.
				closeWhileBusy(t, 8, time.Duration(round%5)*time.Millisecond, func(g int) func(i int) error {
					ev := make([]Event, 4)
					var ids []uint64
					return func(i int) error {
						return runtimeOp(rt, (g+i)%10, r, ev, &ids, uintptr(g), uintptr(i))
					}
				}, func() {
					within(t, "Close", func() {
						if err := rt.Close(); err != nil {
							t.Errorf("Close: %v", err)
						}
					})
				})
				checkAllClosed(t, rt, r)
			}
		})
	}
}

// runtimeOp is operation op (0 to 9) of rt's methods, with the errors a
// concurrent caller may expect (another waiter, a timer fired meanwhile, fd
// already added or removed) taken as success; ids holds the timers added.
func runtimeOp(rt *Runtime, op, fd int, ev []Event, ids *[]uint64, key, data uintptr) error {
	var err error
	switch op {
	case 0:
		_, err = rt.Wait(ev, 2*time.Millisecond)
	case 1:
		err = rt.Post(key, data)
	case 2:
		err = rt.Wakeup()
	case 3:
		var id uint64
		id, err = rt.AddTimer(uint64(data%3), uint64(data%2), 1)
		if err == nil {
			*ids = append(*ids, id)
		}
	case 4:
		if len(*ids) > 0 {
			err = rt.CancelTimer((*ids)[0])
			*ids = (*ids)[1:]
		}
	case 5:
		err = rt.Add(fd, EventRead, 1)
	case 6:
		err = rt.Modify(fd, EventRead|EventWrite)
	case 7:
		err = rt.ModifyContext(fd, EventRead, 9)
	case 8:
		err = rt.Remove(fd)
	case 9:
		_, err = rt.Wait(ev, -1)
	}
	switch {
	case op == 0 || op == 9:
		if errors.Is(err, ErrBusy) {
			return nil
		}
	case op == 4 || op >= 6:
		if errors.Is(err, ErrNotFound) {
			return nil
		}
	case op == 5:
		if errors.Is(err, ErrExists) {
			return nil
		}
	}
	return err
}

// checkAllClosed checks that every method of the closed rt says ErrClosed.
func checkAllClosed(t *testing.T, rt *Runtime, fd int) {
	t.Helper()
	ev := make([]Event, 1)
	checks := map[string]error{
		"Close":       rt.Close(),
		"Post":        rt.Post(1, 1),
		"Wakeup":      rt.Wakeup(),
		"Add":         rt.Add(fd, EventRead, 0),
		"Modify":      rt.Modify(fd, EventRead),
		"ModifyCtx":   rt.ModifyContext(fd, EventRead, 1),
		"Remove":      rt.Remove(fd),
		"CancelTimer": rt.CancelTimer(1),
	}
	_, checks["AddTimer"] = rt.AddTimer(1, 0, 0)
	_, checks["Wait"] = rt.Wait(ev, -1)
	_, checks["Wait0"] = rt.Wait(ev, 0)
	for what, err := range checks {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", what, err)
		}
	}
}

// Bad input to a runtime's Wait and fd registration: documented errors, no
// panic, and the registration made in between still reports its events with
// its context.
func TestFdBadInputLeavesRuntimeIntact(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		r, w := testPipe(t)
		if _, err := rt.Wait(nil, 0); !errors.Is(err, ErrInval) {
			t.Fatalf("Wait(nil): %v", err)
		}
		if _, err := rt.Wait([]Event{}, -1); !errors.Is(err, ErrInval) {
			t.Fatalf("Wait(empty): %v", err)
		}
		for _, fd := range []int{-1, math.MinInt} {
			if err := rt.Add(fd, EventRead, 0); !errors.Is(err, ErrBadFd) {
				t.Fatalf("Add(%d): %v", fd, err)
			}
			if err := rt.Remove(fd); !errors.Is(err, ErrBadFd) {
				t.Fatalf("Remove(%d): %v", fd, err)
			}
			if err := rt.Modify(fd, EventRead); !errors.Is(err, ErrBadFd) {
				t.Fatalf("Modify(%d): %v", fd, err)
			}
		}
		if err := rt.Add(r, 0x80, 0); !errors.Is(err, ErrInval) {
			t.Fatalf("unknown event bits: %v", err)
		}
		if err := rt.Remove(r); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Remove of an unregistered fd: %v", err)
		}
		if err := rt.Modify(r, EventRead); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Modify of an unregistered fd: %v", err)
		}
		// A descriptor number that is not open.
		dead, _ := unix.Dup(r)
		unix.Close(dead)
		if err := rt.Add(dead, EventRead, 0); !errors.Is(err, ErrBadFd) {
			t.Fatalf("Add of a closed fd: %v", err)
		}
		if err := rt.Add(r, EventRead, 5); err != nil {
			t.Fatal(err)
		}
		if err := rt.Add(r, EventWrite, 6); !errors.Is(err, ErrExists) {
			t.Fatalf("duplicate Add: %v", err)
		}
		// After all that, the fd still works, with its context.
		unix.Write(w, []byte("x"))
		ev := make([]Event, 8)
		n, err := rt.Wait(ev, testLimit(t))
		if err != nil || n != 1 || ev[0].Fd != r || ev[0].Context != 5 {
			t.Fatalf("n=%d err=%v ev=%+v", n, err, ev[:n])
		}
	})
}

// RLIMIT_NOFILE exhausted: making runtimes fails with an error (no panic,
// no leaked descriptor of a half-made poller), and works again once
// descriptors are free.
func TestNewRuntimeAtFdLimitFailsCleanly(t *testing.T) {
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	countFds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	for _, name := range port.Backends() {
		t.Run(name, func(t *testing.T) {
			base := countFds()
			// Room for a few runtimes only; the highest open fd must fit.
			lim := old
			lim.Cur = uint64(base + 40)
			if lim.Cur > old.Max {
				t.Skip("hard limit too low")
			}
			if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
				t.Skip(err)
			}
			var rts []*Runtime
			var ferr error
			func() {
				defer func() {
					if e := recover(); e != nil {
						ferr = errors.New("panic")
					}
					unix.Setrlimit(unix.RLIMIT_NOFILE, &old)
				}()
				for i := 0; i < 1000; i++ {
					p, err := port.NewNamed(name)
					if err != nil {
						ferr = err
						return
					}
					rts = append(rts, NewRuntimeWith(p))
				}
			}()
			if ferr == nil || ferr.Error() == "panic" || len(rts) == 0 {
				t.Fatalf("made %d runtimes, err %v (want EMFILE after a few)", len(rts), ferr)
			}
			if !errors.Is(ferr, unix.EMFILE) || CodeOf(ferr) != ESys {
				t.Fatalf("err %v code %d, want EMFILE/ESys", ferr, CodeOf(ferr))
			}
			// Each made runtime works; then all are released.
			for _, rt := range rts {
				rt.Post(1, 1)
				if n, err := rt.Wait(make([]Event, 1), testLimit(t)); n != 1 || err != nil {
					t.Fatalf("runtime made near the limit: n=%d err=%v", n, err)
				}
				if err := rt.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if got := countFds(); got != base {
				t.Fatalf("%d descriptors open after closing all, %d before", got, base)
			}
		})
	}
}

// hugeEvents returns an out slice of n events backed by lazily mapped
// memory (MAP_NORESERVE: nothing is committed until written), so that a Wait
// with an out beyond epoll's limit costs no real memory; skips where the
// host refuses such a mapping.
func hugeEvents(t *testing.T, n int) []Event {
	size := n * int(unsafe.Sizeof(Event{}))
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_NORESERVE)
	if err != nil {
		t.Skipf("cannot map %d bytes: %v", size, err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return unsafe.Slice((*Event)(unsafe.Pointer(&b[0])), n)
}

// A Wait whose out holds more records than epoll_wait accepts (INT_MAX/12,
// about 179 million) harvests at most port.MaxHarvest of them, with buffers
// sized for that bound: the events come and the runtime stays open.
func TestWaitHugeOutHarvestsBounded(t *testing.T) {
	if math.MaxInt == math.MaxInt32 {
		t.Skip("32-bit int")
	}
	out := hugeEvents(t, 179_000_000)
	backends(t, func(t *testing.T, rt *Runtime) {
		r, w := testPipe(t)
		if err := rt.Add(r, EventRead, 4); err != nil {
			t.Fatal(err)
		}
		unix.Write(w, []byte("x"))
		rt.Post(1, 2)
		got := map[uint32]int{}
		for i := 0; i < 3 && (got[EventRead] == 0 || got[EventCompletion] == 0); i++ {
			n, err := rt.Wait(out, 2*time.Second)
			if err != nil {
				t.Fatalf("Wait with len(out) %d: %v", len(out), err)
			}
			for _, e := range out[:n] {
				got[e.Type&(EventRead|EventCompletion)]++
			}
		}
		if got[EventRead] == 0 || got[EventCompletion] != 1 {
			t.Fatalf("events %v", got)
		}
	})
}

// addThenClose adds the read end of a new blocking pipe to rt with context
// 1 and closes it without Remove; with keepFile, a dup keeps its file open.
// It returns the closed number and the pipe's write end.
func addThenClose(t *testing.T, rt *Runtime, keepFile bool) (num, w int) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[1]) })
	if err := rt.Add(p[0], EventRead, 1); err != nil {
		t.Fatal(err)
	}
	if keepFile {
		d, err := unix.Dup(p[0])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(d) })
	}
	unix.Close(p[0])
	return p[0], p[1]
}

// reuseNumber makes a pipe whose read end is num, the lowest free number
// (the test is skipped where the kernel hands out another).
func reuseNumber(t *testing.T, num int) (r, w int) {
	t.Helper()
	r, w = testPipe(t)
	if r != num {
		t.Skipf("fd number not reused (%d vs %d)", r, num)
	}
	return r, w
}

// Modify of a registered fd closed without Remove is ErrBadFd; once the
// number names another file (never added), Modify and ModifyContext of it
// are ErrNotFound and that file is never reported with the context given
// to the failed ModifyContext. (The poll backend may report it under the
// number's old context until Remove or Add, as documented for
// async_runtime_add.) Remove of the number then works, and the new file
// once added comes with its own context.
func TestModifyClosedOrReusedFdNumber(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		closed, _ := addThenClose(t, rt, false)
		if err := rt.Modify(closed, EventRead|EventWrite); !errors.Is(err, ErrBadFd) {
			t.Errorf("Modify of a closed fd: %v, want ErrBadFd", err)
		}
		if err := rt.ModifyContext(closed, EventRead, 5); !errors.Is(err, ErrBadFd) {
			t.Errorf("ModifyContext of a closed fd: %v, want ErrBadFd", err)
		}
		q0, q1 := reuseNumber(t, closed)
		if err := rt.Modify(q0, EventRead); !errors.Is(err, ErrNotFound) {
			t.Errorf("Modify of a reused number: %v, want ErrNotFound", err)
		}
		if err := rt.ModifyContext(q0, EventRead, 5); !errors.Is(err, ErrNotFound) {
			t.Errorf("ModifyContext of a reused number: %v, want ErrNotFound", err)
		}
		unix.Write(q1, []byte("x"))
		ev := make([]Event, 4)
		n, err := rt.Wait(ev, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ev[:n] {
			if e.Context == 5 {
				t.Errorf("event with the context of a failed ModifyContext: %+v", e)
			}
		}
		if err := rt.Remove(q0); err != nil {
			t.Fatalf("Remove of the old registration: %v", err)
		}
		if err := rt.Add(q0, EventRead, 9); err != nil {
			t.Fatal(err)
		}
		n, err = rt.Wait(ev, 2*time.Second)
		if err != nil || n != 1 || ev[0].Fd != q0 || ev[0].Context != 9 {
			t.Fatalf("after re-add: n=%d err=%v ev=%+v", n, err, ev[:n])
		}
	})
}

// Wakeup with nobody waiting: the next Wait returns at once (with 0), even
// with a long or no timeout, a timer pending and an fd registered or not.
func TestWakeupBeforeWaitReturnsAtOnce(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		r, _ := testPipe(t)
		ev := make([]Event, 4)
		for _, withFd := range []bool{false, true} {
			if withFd {
				if err := rt.Add(r, EventRead, 1); err != nil {
					t.Fatal(err)
				}
			}
			id, _ := rt.AddTimer(1e6, 0, 1) // pending, far
			for _, to := range []time.Duration{-1, time.Hour} {
				if err := rt.Wakeup(); err != nil {
					t.Fatal(err)
				}
				what := fmt.Sprintf("fd %v timeout %v", withFd, to)
				if n, err := startWait(t, rt, ev, to)(what); n != 0 || err != nil {
					t.Fatalf("%s: n=%d err=%v", what, n, err)
				}
			}
			rt.CancelTimer(id)
		}
	})
}

// A registered fd closed without Remove while a dup keeps its file open
// (epoll keeps a ghost registration), its number reused by another file:
// Remove of the number works, the old file's readiness is never reported
// again, and the new file once added comes with its own context only.
func TestRemoveReusedNumberWhileDupKeepsOldFile(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		closed, oldW := addThenClose(t, rt, true)
		q0, q1 := reuseNumber(t, closed)
		if err := rt.Remove(q0); err != nil {
			t.Fatalf("Remove of the reused number: %v", err)
		}
		unix.Write(oldW, []byte("old")) // the old file (still open through the dup) is readable
		ev := make([]Event, 4)
		for i := 0; i < 3; i++ {
			n, err := rt.Wait(ev, 5*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ev[:n] {
				t.Fatalf("event after Remove: %+v", e)
			}
		}
		if err := rt.Add(q0, EventRead, 2); err != nil {
			t.Fatalf("Add of the new file: %v", err)
		}
		unix.Write(q1, []byte("new"))
		seen := 0
		for i := 0; i < 5; i++ {
			n, err := rt.Wait(ev, 5*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ev[:n] {
				if e.Fd != q0 || e.Context != 2 {
					t.Fatalf("event %+v (want fd %d ctx 2 only)", e, q0)
				}
				seen++
			}
		}
		if seen == 0 {
			t.Fatal("the new file's readiness never came")
		}
	})
}
