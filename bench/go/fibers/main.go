// Fibers, Go peer: the same four micro-benchmarks as bench/fibers_async.c,
// on goroutines. GOMAXPROCS is the second argument (1 = one thread runs Go
// code, like one libasync worker or Boost.Fiber's single thread).
//
// usage: fibers yield    procs goroutines yields_per_goroutine  (runtime.Gosched)
//
//	fibers spawn    procs total batch                       (go + sync.WaitGroup)
//	fibers pingpong procs round_trips                       (two unbuffered channels)
//	fibers parked   procs goroutines                        (each blocks on <-ch)
package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"libasync/bench/peer"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: fibers yield|spawn|pingpong|parked procs ...")
		os.Exit(2)
	}
	procs := peer.Arg(2, 1)
	runtime.GOMAXPROCS(procs)
	switch os.Args[1] {
	case "yield":
		yield(procs, peer.Arg(3, 2), peer.Arg(4, 1000000))
	case "spawn":
		spawn(procs, peer.Arg(3, 200000), peer.Arg(4, 100))
	case "pingpong":
		pingpong(procs, peer.Arg(3, 1000000))
	case "parked":
		parked(procs, peer.Arg(3, 1000000))
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}

// The clock starts when the first goroutine starts and stops when the last
// one ends, as in the C version.
func yield(procs, n, per int) {
	var first, last atomic.Int64
	var finished, counted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first.CompareAndSwap(0, time.Now().UnixNano())
			for i := 0; i < per; i++ {
				runtime.Gosched()
			}
			counted.Add(int64(per))
			if finished.Add(1) == int64(n) {
				last.Store(time.Now().UnixNano())
			}
		}()
	}
	wg.Wait()
	yields := counted.Load()
	if yields != int64(n*per) {
		peer.Fail("%d yields, expected %d", yields, n*per)
	}
	ns := float64(last.Load() - first.Load())
	fmt.Printf("ok=1 procs=%d goroutines=%d yields=%d secs=%.4f ns_per_yield=%.2f\n", procs, n, yields, ns/1e9, ns/float64(yields))
}

func spawn(procs, total, batch int) {
	var counted atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for done := 0; done < total; done += batch {
		b := min(batch, total-done)
		wg.Add(b)
		for i := 0; i < b; i++ {
			go func() {
				counted.Add(1)
				wg.Done()
			}()
		}
		wg.Wait()
	}
	ns := float64(time.Since(t0).Nanoseconds())
	if counted.Load() != int64(total) {
		peer.Fail("%d goroutines ran, expected %d", counted.Load(), total)
	}
	fmt.Printf("ok=1 procs=%d goroutines=%d batch=%d secs=%.4f ns_per_fiber=%.1f\n", procs, total, batch, ns/1e9, ns/float64(total))
}

func pingpong(procs, n int) {
	a, b := make(chan uint64), make(chan uint64)
	go func() {
		for i := 0; i < n; i++ {
			x := <-a
			b <- x + 1
		}
	}()
	t0 := time.Now()
	for i := uint64(0); i < uint64(n); i++ {
		a <- i
		if x := <-b; x != i+1 {
			peer.Fail("round trip %d came back as %d", i, x)
		}
	}
	ns := float64(time.Since(t0).Nanoseconds())
	fmt.Printf("ok=1 procs=%d round_trips=%d secs=%.4f ns_per_rt=%.1f\n", procs, n, ns/1e9, ns/float64(n))
}

func vmRSSKiB() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			v, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return v
		}
	}
	return -1
}

func parked(procs, n int) {
	ch := make(chan uint64)
	var started, woke atomic.Int64
	var last atomic.Int64
	var wg sync.WaitGroup
	runtime.GC()
	rss0 := vmRSSKiB()
	t0 := time.Now().UnixNano()
	wg.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer wg.Done()
			if started.Add(1) == int64(n) {
				last.Store(time.Now().UnixNano())
			}
			if _, ok := <-ch; !ok {
				woke.Add(1)
			}
		}()
	}
	for i := 0; started.Load() < int64(n); i++ {
		if i > 120000 {
			peer.Fail("only %d of %d goroutines started in 120 s", started.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
	// Every goroutine that counted itself is now blocked on <-ch or about to
	// be; give the last ones a moment to get there.
	time.Sleep(20 * time.Millisecond)
	rss1 := vmRSSKiB()
	createNs := float64(last.Load()-t0) / float64(n)
	t1 := time.Now()
	close(ch)
	wg.Wait()
	wakeNs := float64(time.Since(t1).Nanoseconds()) / float64(n)
	if woke.Load() != int64(n) {
		peer.Fail("%d of %d goroutines woke from the closed channel", woke.Load(), n)
	}
	if rss0 < 0 || rss1 < 0 {
		peer.Fail("no VmRSS in /proc/self/status")
	}
	fmt.Printf("ok=1 procs=%d goroutines=%d rss_mib=%.1f rss_per_fiber_b=%.0f create_ns=%.1f close_wake_ns=%.1f\n",
		procs, n, float64(rss1-rss0)/1024, float64(rss1-rss0)*1024/float64(n), createNs, wakeNs)
}
