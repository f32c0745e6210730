package rt

import (
	"testing"
	"unsafe"

	pointer "github.com/mattn/go-pointer"
)

// synthetic makes a handle value as la_handle_alloc would (see base.h).
func synthetic(idx uint32, typ, gen uint64) uint64 { return gen<<32 | typ<<24 | uint64(idx) }

func TestTableRejectsStaleAndForeignHandles(t *testing.T) {
	o := &object{rt: &rtObject{}}
	h := synthetic(4000, 3, 7)
	publish(h, o)
	if lookup(h) == nil {
		t.Fatal("live handle not found")
	}
	for _, bad := range []uint64{0, h + 1<<32, h ^ 1<<24, h + 1, 1 << 63, synthetic(0, 3, 7), h + 1<<56} {
		if lookup(bad) != nil {
			t.Fatalf("lookup(%#x) found an object", bad)
		}
	}
	notRuntime := func(o *object) bool { return o.rt == nil }
	if unpublish(h, notRuntime) != nil || lookup(h) == nil {
		t.Fatal("a runtime was unpublished as another kind")
	}
	if unpublish(h, isRuntime) == nil || lookup(h) != nil || unpublish(h, isRuntime) != nil {
		t.Fatal("unpublish must succeed once and hide the object")
	}
	// The slot reused with a new generation: the old handle stays dead.
	publish(synthetic(4000, 3, 8), &object{rt: &rtObject{}})
	if lookup(h) != nil {
		t.Fatal("stale handle resolved to the slot's new object")
	}
}

// The handle lookup of every call, against github.com/mattn/go-pointer's
// Restore (an RWMutex-guarded map). Run:
//
//	go test -run - -bench Lookup -cpu 1,2 ./cabi
func BenchmarkLookupTable(b *testing.B) {
	const n = 1024
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = synthetic(uint32(8192+i), 3, 1)
		publish(hs[i], &object{rt: &rtObject{}})
	}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if lookup(hs[i&(n-1)]) == nil {
				b.Fatal("missing")
			}
			i++
		}
	})
}

func BenchmarkLookupGoPointer(b *testing.B) {
	q := &rtObject{}
	const n = 1024
	ps := make([]unsafe.Pointer, n)
	for i := range ps {
		ps[i] = pointer.Save(q)
	}
	defer func() {
		for _, p := range ps {
			pointer.Unref(p)
		}
	}()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if pointer.Restore(ps[i&(n-1)]) == nil {
				b.Fatal("missing")
			}
			i++
		}
	})
}

// BenchmarkGoPointerStaleReuse measures how often a destroyed go-pointer
// handle resolves to a newer object (the ABA hazard), reported as
// stale-hits/op; the integer table's answer is always 0 (see the test above).
func BenchmarkGoPointerStaleReuse(b *testing.B) {
	a, c := &rtObject{}, &rtObject{}
	hits := 0
	for i := 0; i < b.N; i++ {
		p := pointer.Save(a)
		pointer.Unref(p)
		p2 := pointer.Save(c)
		if pointer.Restore(p) == c {
			hits++
		}
		pointer.Unref(p2)
	}
	b.ReportMetric(float64(hits)/float64(b.N), "stale-hits/op")
}
