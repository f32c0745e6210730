//go:build unix

package libasync

import (
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestFdReadinessLevelTriggered(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
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
