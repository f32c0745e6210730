package libasync

import (
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/libasync/libasync/port"
)

// budgetMem is a Mem with a byte budget. Its blocks are Go memory kept
// alive in a map (the runtime treats them as foreign memory).
type budgetMem struct {
	left   int
	blocks map[unsafe.Pointer][]byte
}

func (m *budgetMem) Realloc(p unsafe.Pointer, size uintptr) unsafe.Pointer {
	old := m.blocks[p]
	if int(size)-len(old) > m.left {
		return nil
	}
	b := make([]byte, size)
	copy(b, old)
	m.left -= int(size) - len(old)
	delete(m.blocks, p)
	np := unsafe.Pointer(&b[0])
	m.blocks[np] = b
	return np
}

func (m *budgetMem) Free(p unsafe.Pointer) {
	if b, ok := m.blocks[p]; ok {
		m.left += len(b)
		delete(m.blocks, p)
	}
}

// With a Mem, running out of memory is ErrNoMem from AddTimer and a shorter
// batch from Wait, and both work again once memory is back.
func TestMemExhaustion(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		// 64 timers (slab and free list) and a poller buffer of 8 events.
		budget := 64*int(unsafe.Sizeof(timerEntry{})) + 64*4 + 8*int(unsafe.Sizeof(port.Event{}))
		m := &budgetMem{left: budget, blocks: map[unsafe.Pointer][]byte{}}
		if err := rt.setMem(m, 8); err != nil {
			t.Fatal(err)
		}
		var ids []uint64
		for {
			id, err := rt.AddTimer(0, 0, 7)
			if err != nil {
				if !errors.Is(err, ErrNoMem) {
					t.Fatal(err)
				}
				break
			}
			ids = append(ids, id)
			if len(ids) > 1000 {
				t.Fatal("the budget was not enforced")
			}
		}
		if len(ids) != 64 {
			t.Fatalf("%d timers before NOMEM, want 64", len(ids))
		}
		// Wait asks for 64 events; the buffer cannot grow past 8: it
		// delivers 8 at a time, every timer once.
		ev := make([]Event, 64)
		seen := map[uint64]bool{}
		for len(seen) < len(ids) {
			n, err := rt.Wait(ev, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 || n > 8 {
				t.Fatalf("n=%d", n)
			}
			for _, e := range ev[:n] {
				if e.Type != EventTimer || seen[uint64(e.Data)] {
					t.Fatalf("event %+v", e)
				}
				seen[uint64(e.Data)] = true
			}
		}
		// Fired one-shot timers are free slots again: no growth needed.
		if _, err := rt.AddTimer(0, 0, 7); err != nil {
			t.Fatal(err)
		}
		m.left += 1 << 20 // memory is back
		for i := 0; i < 100; i++ {
			if _, err := rt.AddTimer(3600000, 0, 7); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := rt.Wait(ev, time.Second); err != nil || n != 1 {
			t.Fatalf("n=%d err=%v", n, err)
		}
	})
}
