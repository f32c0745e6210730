//go:build unix

package port

import (
	"cmp"
	"math"
	"slices"

	"golang.org/x/sys/unix"
)

func init() { register("poll", newPoll) }

// pollPoller is poll(2) with a self-pipe doorbell: the portable fallback.
// Registrations live in a map; Wait rebuilds its pollfd array only when they
// changed. A change made while a thread waits rings the doorbell so the wait
// restarts with the new set. There is no descriptor limit besides RLIMIT_NOFILE.
type pollPoller struct {
	guardedBell // mu also guards the fields up to fds

	regs    map[int]pollReg
	dirty   bool
	waiting bool
	// rang: a change rang the doorbell during this wait. One RingByte per
	// wait restarts it, so changes never fill the pipe: a full pipe would
	// drop the WakeupByte of an async_runtime_wakeup, and with it the
	// wakeup.
	rang bool

	seq  uint64
	turn uint64 // the clock of pollReg.turn
	// Owned by the waiting thread:
	fds   []unix.PollFd
	seqs  []uint64   // the registration behind each fds entry
	ready []pollTurn // scan's list of the ready entries
}

// pollTurn is a ready entry of fds (i) and the turn of its registration.
type pollTurn struct {
	turn uint64
	i    int
}

// pollReg is one registration: the watched events and the identity of the
// open file, to tell a registration whose fd was closed (and its number
// reused) from a real double add.
type pollReg struct {
	events   uint32
	dev, ino uint64
	seq      uint64 // which registration this is
	// turn: when it was added or last reported by a Wait that could not
	// report every ready fd (pollPoller.turn). Such a Wait reports the
	// ones of the oldest turns, and each takes a turn newer than every
	// other, as an add does. So the registrations ahead of an fd that
	// stays ready only leave (each Wait that passes it over reports as
	// many of them as evs holds): it is reported within ceil(R/len(evs))
	// Waits, R the fds ready meanwhile, whatever comes and goes.
	turn uint64
}

func fileID(fd int) (dev, ino uint64, ok bool) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, false
	}
	return uint64(st.Dev), uint64(st.Ino), true
}

func newPoll() (Poller, error) {
	bell, err := newPipeBell()
	if err != nil {
		return nil, err
	}
	return &pollPoller{guardedBell: guardedBell{pipeBell: bell}, regs: map[int]pollReg{}, dirty: true}, nil
}

func (p *pollPoller) Name() string { return "poll" }

// valid reports whether fd is an open descriptor.
func validFd(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

// unregistered is the error for a Modify or Remove of an fd with no
// registration: ErrBadFd if it is not open, else ErrNotFound.
func unregistered(fd int) error {
	if !validFd(fd) {
		return ErrBadFd
	}
	return ErrNotFound
}

func (p *pollPoller) change(fd int, events uint32, op int) error {
	if err := p.lockFd(fd); err != nil {
		return err
	}
	reg, present := p.regs[fd]
	if fd == p.rfd || fd == p.wfd {
		present = true // the doorbell is ours
	}
	switch op {
	case opAdd:
		dev, ino, ok := fileID(fd)
		if !ok {
			p.mu.Unlock()
			return ErrBadFd
		}
		if present && (fd == p.rfd || fd == p.wfd || (reg.dev == dev && reg.ino == ino)) {
			p.mu.Unlock()
			return ErrExists
		}
		// Not present, or present for a file that was closed since and
		// whose number now names another: (re)register.
		p.seq++
		p.turn++
		p.regs[fd] = pollReg{events & (EventRead | EventWrite | EventClose), dev, ino, p.seq, p.turn}
	case opMod:
		if !present || fd == p.rfd || fd == p.wfd {
			p.mu.Unlock()
			return unregistered(fd)
		}
		// The registration is of the file the number named at Add: if
		// that file was closed, or the number now names another file,
		// there is nothing of the caller's to change (as epoll: EBADF,
		// ENOENT), and a file never added is never watched.
		dev, ino, ok := fileID(fd)
		if !ok {
			p.mu.Unlock()
			return ErrBadFd
		}
		if reg.dev != dev || reg.ino != ino {
			p.mu.Unlock()
			return ErrNotFound
		}
		reg.events = events & (EventRead | EventWrite | EventClose)
		p.regs[fd] = reg
	case opDel:
		if !present || fd == p.rfd || fd == p.wfd {
			p.mu.Unlock()
			return unregistered(fd)
		}
		delete(p.regs, fd)
		if !validFd(fd) {
			// Closed while registered: forget it, and say so as epoll does.
			p.dirty = true
			p.mu.Unlock()
			return ErrBadFd
		}
	}
	p.dirty = true
	var err error
	if p.waiting && !p.rang {
		p.rang = true
		err = p.write(RingByte) // restart the wait with the new set
	}
	p.mu.Unlock()
	return err
}

const (
	opAdd = iota
	opMod
	opDel
)

func (p *pollPoller) Add(fd int, events uint32) error    { return p.change(fd, events, opAdd) }
func (p *pollPoller) Modify(fd int, events uint32) error { return p.change(fd, events, opMod) }
func (p *pollPoller) Remove(fd int) error                { return p.change(fd, 0, opDel) }

func (p *pollPoller) rebuild() {
	p.fds = p.fds[:0]
	p.seqs = p.seqs[:0]
	p.fds = append(p.fds, unix.PollFd{Fd: int32(p.rfd), Events: unix.POLLIN})
	p.seqs = append(p.seqs, 0)
	for fd, reg := range p.regs {
		ev := reg.events
		var bits int16
		if ev&EventRead != 0 {
			bits |= unix.POLLIN
		}
		if ev&EventWrite != 0 {
			bits |= unix.POLLOUT
		}
		if ev&EventClose != 0 {
			// The read-side hang-up only when asked for (see epollBits);
			// POLLHUP and POLLERR always come.
			bits |= pollRdHup
		}
		p.fds = append(p.fds, unix.PollFd{Fd: int32(fd), Events: bits})
		p.seqs = append(p.seqs, reg.seq)
	}
	p.dirty = false
}

func (p *pollPoller) Wait(evs []Event, timeoutMs int) (int, WaitResult, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0, WaitResult{}, ErrClosed
	}
	if p.dirty {
		p.rebuild()
	}
	p.waiting = true
	p.mu.Unlock()

	n, err := pollWait(p.fds, waitMs(timeoutMs))

	p.mu.Lock()
	p.waiting = false
	p.rang = false // its byte is drained below, or ends the next poll at once
	p.mu.Unlock()
	if err != nil {
		return waitFailed(err)
	}
	h := harvest{evs: evs}
	if n > 0 && p.fds[0].Revents != 0 { // the doorbell
		n--
		h.rang(p.drain())
	}
	p.scan(&h, n)
	return h.result()
}

// scan reports the n ready registered fds (fds[1:]). With more than evs
// has room for, it reports those whose registrations have the oldest turns
// (an entry whose registration is gone since the rebuild counts as the
// newest) and gives them new turns (see pollReg.turn).
func (p *pollPoller) scan(h *harvest, n int) {
	ready := p.ready[:0]
	for i := 1; i < len(p.fds) && len(ready) < n; i++ {
		if p.fds[i].Revents != 0 {
			ready = append(ready, pollTurn{i: i})
		}
	}
	p.ready = ready
	if room := len(h.evs) - h.n; len(ready) > room {
		p.mu.Lock()
		for k := range ready {
			ready[k].turn = math.MaxUint64
			if reg, ok := p.current(ready[k].i); ok {
				ready[k].turn = reg.turn
			}
		}
		slices.SortFunc(ready, func(a, b pollTurn) int { return cmp.Compare(a.turn, b.turn) })
		ready = ready[:room]
		for _, t := range ready {
			if reg, ok := p.current(t.i); ok {
				p.turn++
				reg.turn = p.turn
				p.regs[int(p.fds[t.i].Fd)] = reg
			}
		}
		p.mu.Unlock()
	}
	for _, t := range ready {
		h.add(int(p.fds[t.i].Fd), p.events(t.i))
	}
}

// current returns the registration behind fds[i] if it is still the one
// the entry was built for. Under mu.
func (p *pollPoller) current(i int) (pollReg, bool) {
	reg, ok := p.regs[int(p.fds[i].Fd)]
	return reg, ok && reg.seq == p.seqs[i]
}

// events translates the revents of fds[i] into Event bits. An fd closed
// while registered (POLLNVAL) is reported once, with EventClose, and its
// registration forgotten.
func (p *pollPoller) events(i int) uint32 {
	pf := &p.fds[i]
	var bits uint32
	if pf.Revents&unix.POLLIN != 0 {
		bits |= EventRead
	}
	if pf.Revents&unix.POLLOUT != 0 {
		bits |= EventWrite
	}
	if pf.Revents&(unix.POLLERR|unix.POLLNVAL) != 0 {
		bits |= EventError
	}
	if pf.Revents&unix.POLLNVAL != 0 {
		bits |= EventClose
		p.mu.Lock()
		if _, ok := p.current(i); ok {
			delete(p.regs, int(pf.Fd))
			p.dirty = true
		}
		p.mu.Unlock()
	}
	if pf.Revents&(unix.POLLHUP|pollRdHup) != 0 {
		bits |= EventClose
	}
	return bits
}

func (p *pollPoller) Close() error { return p.shut(p.pipeBell.close) }
