// queue, Go peer (for context, no target): a buffered channel of 16-byte
// messages, P producer goroutines and one consumer, with the same checks as
// bench/queue.h.
//
// usage: chanqueue [producers=1] [per_producer=500000]
package main

import (
	"fmt"
	"sync"
	"time"

	"libasync/bench/peer"
)

type msg struct{ producer, seq uint64 }

func main() {
	producers, perProducer := peer.Arg(1, 1), peer.Arg(2, 500000)
	ch := make(chan msg, 1024)
	var start, done sync.WaitGroup
	start.Add(1)
	for p := 1; p <= producers; p++ {
		done.Add(1)
		go func(p uint64) {
			defer done.Done()
			start.Wait()
			for i := 1; i <= perProducer; i++ {
				ch <- msg{p, uint64(i)}
			}
		}(uint64(p))
	}
	next := make([]uint64, producers+1)
	for i := range next {
		next[i] = 1
	}
	total := producers * perProducer
	var sum uint64
	t0 := time.Now()
	start.Done()
	for got := 0; got < total; got++ {
		m := <-ch
		if m.producer < 1 || m.producer > uint64(producers) || m.seq != next[m.producer] {
			peer.Fail("lost, duplicated or reordered message (producer %d seq %d)", m.producer, m.seq)
		}
		next[m.producer]++
		sum += m.seq
	}
	secs := time.Since(t0).Seconds()
	done.Wait()
	if want := uint64(producers) * uint64(perProducer) * uint64(perProducer+1) / 2; sum != want {
		peer.Fail("checksum %d, expected %d", sum, want)
	}
	fmt.Printf("ok=1 msgs=%d secs=%.4f msgs_per_s=%.0f\n", total, secs, float64(total)/secs)
}
