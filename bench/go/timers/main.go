// timers, Go peer: time.AfterFunc for N timers with the same delays as
// bench/timers_async.c, then Stop on each in start order; two passes like
// timers_async (the first "cold", the second "warm" and the headline).
//
// usage: timers [n=1000000]
package main

import (
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

func delay(i int) time.Duration {
	return time.Duration(10000+(uint64(i)*2654435761)%100000) * time.Millisecond
}

var fired atomic.Bool

func pass(timers []*time.Timer) (startNs, cancelNs float64) {
	f := func() { fired.Store(true) }
	t0 := time.Now()
	for i := range timers {
		timers[i] = time.AfterFunc(delay(i), f)
	}
	t1 := time.Now()
	for i, t := range timers {
		if !t.Stop() {
			fmt.Printf("ok=0 error=\"timer %d was not active when stopped\"\n", i)
			os.Exit(1)
		}
	}
	t2 := time.Now()
	n := float64(len(timers))
	return float64(t1.Sub(t0).Nanoseconds()) / n, float64(t2.Sub(t1).Nanoseconds()) / n
}

func main() {
	n := 1000000
	if len(os.Args) > 1 {
		v, err := strconv.Atoi(os.Args[1])
		if err != nil || v <= 0 {
			fmt.Fprintln(os.Stderr, "bad count:", os.Args[1])
			os.Exit(2)
		}
		n = v
	}
	timers := make([]*time.Timer, n)
	coldStart, coldCancel := pass(timers)
	start, cancel := pass(timers)
	if fired.Load() {
		fmt.Println("ok=0 error=\"a timer fired\"")
		os.Exit(1)
	}
	fmt.Printf("ok=1 timers=%d start_ns=%.1f cancel_ns=%.1f ns_per_op=%.1f cold_ns_per_op=%.1f\n", n,
		start, cancel, (start+cancel)/2, (coldStart+coldCancel)/2)
}
