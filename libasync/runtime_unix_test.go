//go:build unix

package libasync

// Tests of fd registration on Unix: level-triggered readiness, Modify and
// ModifyContext, and a closed fd's number reused.

import (
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestFdReadinessLevelTriggered(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(sp[0])
		if err := rt.Add(sp[0], EventRead, 0xabc); err != nil {
			t.Fatal(err)
		}
		if err := rt.Add(sp[0], EventRead, 0); !errors.Is(err, ErrExists) {
			t.Fatalf("double add: %v", err)
		}
		ev := make([]Event, 4)
		if n, _ := rt.Wait(ev, 0); n != 0 {
			t.Fatalf("idle socket reported %+v", ev[0])
		}
		unix.Write(sp[1], []byte("x"))
		for round := 0; round < 2; round++ { // reported again: level-triggered
			n, err := rt.Wait(ev, time.Second)
			if err != nil || n != 1 || ev[0].Fd != sp[0] || ev[0].Type&EventRead == 0 || ev[0].Context != 0xabc {
				t.Fatalf("round %d: n=%d err=%v ev=%+v", round, n, err, ev[0])
			}
		}
		if err := rt.Modify(sp[0], EventWrite); err != nil {
			t.Fatal(err)
		}
		n, _ := rt.Wait(ev, time.Second)
		if n != 1 || ev[0].Type&EventWrite == 0 {
			t.Fatalf("write readiness: n=%d ev=%+v", n, ev[0])
		}
		unix.Close(sp[1]) // hang-up
		rt.Modify(sp[0], EventRead)
		n, _ = rt.Wait(ev, time.Second)
		if n != 1 || ev[0].Type&EventClose == 0 {
			t.Fatalf("hang-up: n=%d ev=%+v", n, ev[0])
		}
		if err := rt.Remove(sp[0]); err != nil {
			t.Fatal(err)
		}
		for _, err := range []error{rt.Remove(sp[0]), rt.Modify(sp[0], EventRead)} {
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("unknown fd: %v", err)
			}
		}
		if err := rt.Add(-1, EventRead, 0); !errors.Is(err, ErrBadFd) {
			t.Fatalf("fd -1: %v", err)
		}
		if err := rt.Add(sp[0], 0x10, 0); !errors.Is(err, ErrInval) {
			t.Fatalf("bad bits: %v", err)
		}
		f, _ := os.CreateTemp(t.TempDir(), "x")
		fd := int(f.Fd())
		f.Close()
		if err := rt.Add(fd, EventRead, 0); !errors.Is(err, ErrBadFd) {
			t.Fatalf("closed fd: %v", err)
		}
	})
}

// A registered fd closed without Remove: a new descriptor that gets the same
// number can be added again (epoll forgot the old one; poll tells the files
// apart), and a real double add still fails.
func TestClosedFdNumberCanBeReused(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		var p [2]int
		if err := unix.Pipe(p[:]); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(p[1])
		if err := rt.Add(p[0], EventRead, 1); err != nil {
			t.Fatal(err)
		}
		unix.Close(p[0])
		ev := make([]Event, 4)
		rt.Wait(ev, 0) // poll reports the closed fd once; epoll nothing
		var q [2]int
		if err := unix.Pipe(q[:]); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(q[0])
		defer unix.Close(q[1])
		if q[0] != p[0] {
			t.Skipf("fd number not reused (%d vs %d)", q[0], p[0])
		}
		if err := rt.Add(q[0], EventRead, 2); err != nil {
			t.Fatalf("re-add of a reused fd number: %v", err)
		}
		if err := rt.Add(q[0], EventRead, 2); !errors.Is(err, ErrExists) {
			t.Fatalf("double add: %v", err)
		}
		unix.Write(q[1], []byte("x"))
		n, _ := rt.Wait(ev, time.Second)
		if n != 1 || ev[0].Fd != q[0] || ev[0].Context != 2 || ev[0].Type&EventRead == 0 {
			t.Fatalf("n=%d ev=%+v", n, ev[0])
		}
	})
}

func TestModifyContext(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(sp[0])
		defer unix.Close(sp[1])
		if err := rt.Add(sp[0], EventRead, 0x111); err != nil {
			t.Fatal(err)
		}
		unix.Write(sp[1], []byte("x"))
		ev := make([]Event, 4)
		if n, _ := rt.Wait(ev, time.Second); n != 1 || ev[0].Context != 0x111 {
			t.Fatalf("before: n=%d ev=%+v", n, ev[0])
		}
		if err := rt.ModifyContext(sp[0], EventRead|EventWrite, 0x222); err != nil {
			t.Fatal(err)
		}
		n, _ := rt.Wait(ev, time.Second)
		if n != 1 || ev[0].Context != 0x222 || ev[0].Type&(EventRead|EventWrite) != EventRead|EventWrite {
			t.Fatalf("after: n=%d ev=%+v", n, ev[0])
		}
		if err := rt.Modify(sp[0], EventRead); err != nil { // the plain Modify keeps the context
			t.Fatal(err)
		}
		if n, _ := rt.Wait(ev, time.Second); n != 1 || ev[0].Context != 0x222 {
			t.Fatalf("plain modify: n=%d ev=%+v", n, ev[0])
		}
		if err := rt.ModifyContext(-1, EventRead, 0); !errors.Is(err, ErrBadFd) {
			t.Fatalf("fd -1: %v", err)
		}
		if err := rt.ModifyContext(sp[1], EventRead, 0); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unregistered: %v", err)
		}
	})
}
