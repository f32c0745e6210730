package libasync

// FiberWait is the registration of a caller that must not block the thread
// it runs on (a fiber of the C scheduler): instead of sleeping in the
// queue's wait list it asks to be notified, parks by its own means, and
// retries the operation when notified.
//
// Protocol: EnqueueOrRegister / DequeueOrRegister either complete (or fail)
// at once, or return a registration. notify is called at most once, from
// another goroutine, when the caller should retry. The caller then calls
// Done (it was notified and will retry) or Cancel (it gave up: timeout or
// cancellation). After Cancel returns, notify is never called; a wake-up
// that had already reached the registration is passed on to the next
// waiter, so none is lost.
type FiberWait struct {
	q    *Queue
	list *waitList
	w    *waiter
}

// register lists a waiter whose wake-up is a call of notify, made under q.mu
// by whoever frees room or brings a message. Called with q.mu held.
func (q *Queue) register(list *waitList, notify func()) *FiberWait {
	fw := &FiberWait{q: q, list: list, w: &waiter{notify: notify}}
	list.push(fw.w)
	return fw
}

// EnqueueOrRegister enqueues data if the queue has room (or drops the head
// with DropOldest). When the queue is full and wait is true (and the policy
// is not DropOldest) it registers and returns (fw, nil); otherwise it returns
// the result of the enqueue.
func (q *Queue) EnqueueOrRegister(data []byte, wait bool, notify func()) (*FiberWait, error) {
	for {
		err := q.EnqueueWait(data, 0, false)
		if err != ErrFull || !wait {
			return nil, err
		}
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return nil, ErrClosed
		}
		if q.count < q.capacity {
			q.mu.Unlock()
			continue
		}
		fw := q.register(&q.writers, notify)
		q.mu.Unlock()
		return fw, nil
	}
}

// DequeueOrRegister dequeues into buf if a message is there; when the queue
// is empty it registers and returns (0, fw, nil).
func (q *Queue) DequeueOrRegister(buf []byte, notify func()) (int, *FiberWait, error) {
	for {
		n, err := q.DequeueTimeout(buf, 0)
		if err != ErrEmpty {
			return n, nil, err
		}
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return 0, nil, ErrClosed
		}
		if q.count > 0 {
			q.mu.Unlock()
			continue
		}
		fw := q.register(&q.readers, notify)
		q.mu.Unlock()
		return 0, fw, nil
	}
}

// Done ends a registration whose notify was called.
func (fw *FiberWait) Done() {}

// Cancel ends a registration whose owner gives up waiting. notify is called
// under the queue's lock, so after Cancel it is never called; a wake-up that
// had already reached this registration is passed on, so none is lost.
func (fw *FiberWait) Cancel() {
	q := fw.q
	q.mu.Lock()
	if !fw.list.remove(fw.w) && !q.closed {
		fw.list.wakeOne()
	}
	q.mu.Unlock()
}
