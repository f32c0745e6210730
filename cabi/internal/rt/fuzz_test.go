package rt

import (
	"runtime"
	"sync/atomic"
	"testing"
)

// poster is a goroutine locked to its OS thread: la_rt_post keeps state per
// thread (its producer record and block for each runtime), so posts from a
// poster come from that thread and no other.
type poster struct {
	req  chan func()
	done chan struct{}
	busy bool // started, not waited for
}

func newPoster() *poster {
	p := &poster{req: make(chan func()), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread()
		// Returning while locked ends the thread (its records are orphaned:
		// completions.c's on_thread_exit) unless the loop below runs on.
		for fn := range p.req {
			if fn == nil {
				p.done <- struct{}{}
				return
			}
			fn()
			p.done <- struct{}{}
		}
	}()
	return p
}

// run runs fn on the poster's thread and waits for it: the driver's
// sequence of calls is a happens-before chain across the threads.
func (p *poster) run(fn func()) {
	p.req <- fn
	<-p.done
}

// start runs fn on the poster's thread without waiting; wait waits for it.
func (p *poster) start(fn func()) { p.req <- fn; p.busy = true }
func (p *poster) wait()           { <-p.done; p.busy = false }

// exit ends the goroutine and with it the OS thread.
func (p *poster) exit() {
	if p.busy { // the driver failed during a round
		p.wait()
	}
	p.req <- nil
	<-p.done
}

type entry struct{ key, data uintptr }

// thread is the poster that posted e (the driver's keys carry it).
func (e entry) thread() uintptr { return e.key >> 4 & 0xf }

// expected is an entry of the model: grp 0 for a post issued alone (it
// comes out exactly in its place), else the concurrent round it belongs to
// (its entries come out in any merge of their threads' orders, after
// everything before the round and before everything after it).
type expected struct {
	e   entry
	grp int
}

// FuzzCompletionsDiff drives the C completion path (completions.c, through
// fuzzhooks.go) against a FIFO model: posts from up to four OS threads and
// from the driver's own goroutine (any thread), takes of k entries (as pairs
// or as completion events), pending(), two runtimes at a time, a runtime
// closed and replaced, posts to a closed runtime's handle, threads that
// exit with entries still queued. The posts are issued one at a time, each
// finished before the next starts, so every post happens before the next
// and the C path must deliver exactly the issue order: every entry once,
// none invented, none reordered, pending() true exactly while the model
// holds entries. Concurrent rounds (2 to 4 threads posting at once, the
// driver taking meanwhile or not) only fix each thread's order and the
// round's place between what was issued before and after it.
//
//	go test -run - -fuzz FuzzCompletionsDiff ./cabi/internal/rt
func FuzzCompletionsDiff(f *testing.F) {
	f.Add([]byte{0, 1, 8, 2, 16, 3, 4, 2, 4, 9, 5})
	f.Add([]byte{3, 200, 4, 40, 11, 120, 4, 255, 3, 140, 12, 7, 5})
	f.Add([]byte{0, 1, 64, 2, 72, 3, 76, 5, 4, 3, 68, 4, 6, 0, 7, 0, 5, 4, 9})
	f.Add([]byte{31, 20, 0, 1, 8, 2, 15, 0, 16, 3, 4, 1, 23, 5, 12, 0, 7, 4, 255})
	f.Add([]byte{3, 127, 11, 127, 19, 127, 4, 33, 4, 33, 12, 33, 4, 0, 4, 255, 5})
	f.Add([]byte{6, 0, 1, 2, 3, 7, 4, 250, 46, 64, 14, 0, 22, 4, 5})
	// concurrent rounds: 39 (runtime 0), 79 (runtime 1), 159 and 239 (the
	// same with takes racing the posts)
	f.Add([]byte{39, 30, 5, 4, 3, 159, 200, 9, 5, 4, 40, 0, 1, 39, 2, 2})
	f.Add([]byte{79, 255, 2, 239, 100, 1, 0, 1, 69, 8, 5, 159, 11, 4, 68, 255})
	f.Fuzz(completionsDiff)
}

func completionsDiff(t *testing.T, in []byte) {
	var posters [4]*poster
	defer func() {
		for _, p := range posters {
			if p != nil {
				p.exit()
			}
		}
	}()
	// on runs fn on thread i (0..3) or, for 4, on the driver's goroutine.
	on := func(i int, fn func()) {
		if i >= len(posters) {
			fn()
			return
		}
		if posters[i] == nil {
			posters[i] = newPoster()
		}
		posters[i].run(fn)
	}
	var rts [2]*fuzzRTC
	var model [2][]expected
	grp := 0
	var stale []uint64
	for i := range rts {
		if rts[i] = fuzzRTCNew(); rts[i] == nil {
			t.Fatal("la_rtc_new failed")
		}
	}
	defer func() {
		for _, r := range rts {
			r.close()
		}
	}()
	seq := uintptr(0)
	post := func(step, th, ri int, key uintptr) {
		seq++
		e := entry{key<<8 | uintptr(th)<<4 | uintptr(ri), seq}
		var rc int
		on(th, func() { rc = fuzzPost(rts[ri].h, e.key, e.data) })
		if rc != 0 {
			t.Fatalf("step %d: post on thread %d to runtime %d: %d", step, th, ri, rc)
		}
		model[ri] = append(model[ri], expected{e, 0})
	}
	// take checks what la_rtc_take(_events) delivers against the model.
	// While a concurrent round is still posting (racing), fewer entries
	// than k may come out; otherwise exactly min(k, pending).
	take := func(step, ri, k int, events bool, racing bool) {
		keys, data, ok := rts[ri].take(k, events)
		if !ok {
			t.Fatalf("step %d: take_events delivered an event that is no completion", step)
		}
		want := k
		if want > len(model[ri]) {
			want = len(model[ri])
		}
		if len(keys) > want || !racing && len(keys) != want {
			t.Fatalf("step %d: take %d from runtime %d: got %d entries, want %d (%d pending in the model)",
				step, k, ri, len(keys), want, len(model[ri]))
		}
		for i := range keys {
			g, m := entry{keys[i], data[i]}, model[ri]
			j := 0
			if m[0].grp != 0 {
				// the first entry of g's thread in the head's round
				for j < len(m) && m[j].grp == m[0].grp && m[j].e.thread() != g.thread() {
					j++
				}
				if j == len(m) || m[j].grp != m[0].grp {
					j = 0
				}
			}
			if g != m[j].e {
				t.Fatalf("step %d: take from runtime %d, entry %d: got %+v, want %+v (round %d)",
					step, ri, i, g, m[j].e, m[j].grp)
			}
			model[ri] = append(m[:j:j], m[j+1:]...)
		}
	}
	// round: nth threads post n entries each at once to runtime ri; the
	// driver takes meanwhile if racing.
	round := func(step, ri, nth, n int, racing bool, k int, events bool) {
		grp++
		for th := 0; th < nth; th++ {
			for i := 0; i < n; i++ {
				seq++
				model[ri] = append(model[ri], expected{entry{uintptr(i)<<8 | uintptr(th)<<4 | uintptr(ri), seq}, grp})
			}
		}
		base := seq - uintptr(nth*n)
		rcs := make([]int, nth)
		gate := make(chan struct{}) // the threads start together
		var fin atomic.Int32
		for th := 0; th < nth; th++ {
			if posters[th] == nil {
				posters[th] = newPoster()
			}
			th := th
			first := base + uintptr(th*n)
			posters[th].start(func() {
				<-gate
				for i := 0; i < n && rcs[th] == 0; i++ {
					rcs[th] = fuzzPost(rts[ri].h, uintptr(i)<<8|uintptr(th)<<4|uintptr(ri), first+uintptr(i)+1)
				}
				fin.Add(1)
			})
		}
		close(gate)
		for i := 0; racing && fin.Load() < int32(nth); i++ {
			take(step, ri, 1+(k+i)%17, events, true)
		}
		for th := 0; th < nth; th++ {
			posters[th].wait()
			if rcs[th] != 0 {
				t.Fatalf("step %d: concurrent post on thread %d: %d", step, th, rcs[th])
			}
		}
	}
	check := func(step int) {
		for ri, r := range rts {
			if got, want := r.pending(), len(model[ri]) > 0; got != want {
				t.Fatalf("step %d: runtime %d: pending() %v, model holds %d", step, ri, got, len(model[ri]))
			}
		}
	}
	r := 0
	next := func() int {
		if r >= len(in) {
			return 0
		}
		r++
		return int(in[r-1])
	}
	for step := 0; r < len(in); step++ {
		b := next()
		th, ri := (b>>3)%5, (b>>6)&1
		switch b % 8 {
		case 0, 1, 2: // one post
			post(step, th, ri, uintptr(next()))
		case 3: // a burst from one thread: runs of 16 and 4 KiB blocks fill up
			n := 1 + next()*2
			for i := 0; i < n; i++ {
				post(step, th, ri, uintptr(i))
			}
		case 4: // take k, as pairs or as completion events
			k := next()
			take(step, ri, k%48, k&0x80 != 0, false)
		case 5:
			check(step)
		case 6: // close a runtime (its entries go with it) and make another
			stale = append(stale, rts[ri].h)
			rts[ri].close()
			model[ri] = nil
			if rts[ri] = fuzzRTCNew(); rts[ri] == nil {
				t.Fatal("la_rtc_new failed")
			}
		case 7:
			switch (b >> 3) % 5 {
			case 0: // a closed runtime's handle is refused
				if len(stale) > 0 {
					h := stale[next()%len(stale)]
					var rc int
					on(next()%5, func() { rc = fuzzPost(h, 1, 1) })
					if rc != 2 { // ASYNC_E_BADHANDLE
						t.Fatalf("step %d: post to a closed runtime: %d", step, rc)
					}
				}
			case 1: // a thread exits; its queued entries stay deliverable
				if i := next() % 4; posters[i] != nil {
					posters[i].exit()
					posters[i] = nil
				}
			case 2: // round robin over the threads
				n := 1 + next()
				for i := 0; i < n; i++ {
					post(step, i%5, ri, uintptr(i))
				}
			case 3: // drain
				take(step, ri, len(model[ri])+1, b&0x80 != 0, false)
			case 4: // a concurrent round, the driver taking meanwhile if bit 7
				c, k := next(), next()
				round(step, ri, 2+c%3, 1+c/3, b&0x80 != 0, k, k&1 != 0)
			}
		}
	}
	for ri := range rts {
		take(-1, ri, len(model[ri])+8, ri == 1, false)
	}
	check(-1)
}
