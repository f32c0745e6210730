package libasync

import "time"

// waiter is one blocked caller. It is woken at most once per push; the owner
// of the lock guarding the waitList pops it and signals ch.
type waiter struct {
	ch         chan struct{}
	prev, next *waiter
	listed     bool
}

func newWaiter() *waiter { return &waiter{ch: make(chan struct{}, 1)} }

// wait blocks until woken or until deadline (zero: no deadline); false means
// the deadline passed first.
func (w *waiter) wait(deadline time.Time) bool {
	if deadline.IsZero() {
		<-w.ch
		return true
	}
	d := time.Until(deadline)
	if d <= 0 {
		select {
		case <-w.ch:
			return true
		default:
			return false
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.ch:
		return true
	case <-t.C:
		return false
	}
}

// drain consumes a wake-up that was sent after a timeout.
func (w *waiter) drain() {
	select {
	case <-w.ch:
	default:
	}
}

// waitList is a FIFO of waiters, guarded by its owner's lock.
type waitList struct {
	head, tail *waiter
}

func (l *waitList) push(w *waiter) {
	w.prev, w.next, w.listed = l.tail, nil, true
	if l.tail == nil {
		l.head = w
	} else {
		l.tail.next = w
	}
	l.tail = w
}

// remove unlinks w if it is still listed and reports whether it was.
func (l *waitList) remove(w *waiter) bool {
	if !w.listed {
		return false
	}
	if w.prev == nil {
		l.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		l.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next, w.listed = nil, nil, false
	return true
}

// wakeOne pops the oldest waiter and wakes it.
func (l *waitList) wakeOne() {
	w := l.head
	if w == nil {
		return
	}
	l.remove(w)
	w.ch <- struct{}{}
}

// wakeAll wakes every waiter.
func (l *waitList) wakeAll() {
	for l.head != nil {
		l.wakeOne()
	}
}
