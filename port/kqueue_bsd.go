//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package port

import (
	"syscall"

	"golang.org/x/sys/unix"
)

const defaultBackend = "kqueue"

func init() { register("kqueue", newKqueue) }

// kqueuePoller is level-triggered kqueue with a self-pipe doorbell.
//
// kqueue watches (fd, filter) pairs, not fds, so the poller keeps its own
// table of registrations and turns each one into knotes:
//   - EventWrite: an EVFILT_WRITE knote (level-triggered);
//   - EventRead: an EVFILT_READ knote (level-triggered);
//   - no EventRead: an EVFILT_READ "hang-up sentinel" with EV_CLEAR. Close
//     and error are always reported (as with epoll), but a level-triggered
//     read knote would fire on every wait while unread data sits in the
//     buffer. With EV_CLEAR the sentinel fires once per change; firings
//     without EV_EOF are dropped, and the first one with EV_EOF turns the
//     sentinel level-triggered, so the hang-up is then reported on every
//     wait (EOF is sticky) like everywhere else.
//
// A kevent's EV_EOF becomes EventClose; a non-zero fflags with EV_EOF (the
// socket's pending error) adds EventError. The two knotes of one fd are
// merged into one Event.
//
// The doorbell is a non-blocking pipe, written with the same byte convention
// as the poll backend (RingByte / WakeupByte), so the C side rings it from a
// signal handler with one write(2). EVFILT_USER would save the pipe where it
// exists, but not every kqueue has it and C cannot trigger it signal-safely
// without a second convention; one pipe everywhere keeps one code path.
type kqueuePoller struct {
	kq          int
	guardedBell // mu also guards regs

	regs map[int]*kqReg

	raw   []unix.Kevent_t // owned by the waiting thread
	slot  map[int]int     // fd -> index in the output, rebuilt per Wait
	rearm []int           // sentinels that saw EOF in this Wait
}

type kqReg struct {
	events   uint32 // EventRead|EventWrite|EventClose
	hup      bool   // the sentinel saw EOF and is now level-triggered
	dev, ino uint64 // the open file (see Add)
}

func newKqueue() (Poller, error) {
	// kqueue descriptors are not inherited by fork(2) on these systems;
	// close-on-exec is set anyway, under the fork lock like pipe2 on darwin.
	syscall.ForkLock.RLock()
	kq, err := unix.Kqueue()
	if err == nil {
		unix.CloseOnExec(kq)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, err
	}
	bell, err := newPipeBell()
	if err != nil {
		unix.Close(kq)
		return nil, err
	}
	kp := &kqueuePoller{kq: kq, guardedBell: guardedBell{pipeBell: bell}, regs: map[int]*kqReg{}, slot: map[int]int{}}
	if err := kp.change(bell.rfd, unix.EVFILT_READ, unix.EV_ADD); err != nil {
		kp.closeAll()
		return nil, err
	}
	return kp, nil
}

func (p *kqueuePoller) Name() string { return "kqueue" }

// change applies one knote change. One change per call keeps error
// attribution exact (a failed change list leaves earlier changes applied).
func (p *kqueuePoller) change(fd, filter, flags int) error {
	var kev [1]unix.Kevent_t
	unix.SetKevent(&kev[0], fd, filter, flags)
	for {
		_, err := unix.Kevent(p.kq, kev[:], nil, nil)
		if err != unix.EINTR {
			return err
		}
	}
}

// portErr maps a knote change error to the port's errors.
func portErr(err error) error {
	switch err {
	case nil:
		return nil
	case unix.EBADF:
		return ErrBadFd
	case unix.EINVAL, unix.ENODEV, unix.EPERM, unix.EOPNOTSUPP:
		// The descriptor's type has no such filter: not pollable.
		return ErrBadFd
	}
	return err
}

// readFlags is how the reg's EVFILT_READ knote is registered: level-triggered
// for EventRead or a sentinel that saw EOF, EV_CLEAR for a fresh sentinel.
func (r *kqReg) readFlags() int {
	if r.events&EventRead != 0 || r.hup {
		return unix.EV_ADD
	}
	return unix.EV_ADD | unix.EV_CLEAR
}

func (p *kqueuePoller) own(fd int) bool { return fd == p.kq || fd == p.rfd || fd == p.wfd }

// lookup finds fd's registration for Modify and Remove. A registration whose
// fd was closed (its knotes are gone) is forgotten: ErrBadFd if the number
// is free, ErrNotFound if it now names another file.
func (p *kqueuePoller) lookup(fd int) (*kqReg, error) {
	r, ok := p.regs[fd]
	dev, ino, open := fileID(fd)
	if ok && open && r.dev == dev && r.ino == ino && !p.own(fd) {
		return r, nil
	}
	if ok && !p.own(fd) {
		delete(p.regs, fd)
	}
	if !open {
		return nil, ErrBadFd
	}
	return nil, ErrNotFound
}

func (p *kqueuePoller) Add(fd int, events uint32) error {
	if err := p.lockFd(fd); err != nil {
		return err
	}
	defer p.mu.Unlock()
	if p.own(fd) {
		return ErrExists
	}
	dev, ino, ok := fileID(fd)
	if !ok {
		return ErrBadFd
	}
	// A registration of another file under this number means that fd was
	// closed without Remove (which dropped its knotes) and the number was
	// reused: register the new file. The same file is a double add.
	if old, ok := p.regs[fd]; ok && old.dev == dev && old.ino == ino {
		return ErrExists
	}
	delete(p.regs, fd)
	r := &kqReg{events: events & (EventRead | EventWrite | EventClose), dev: dev, ino: ino}
	if err := p.change(fd, unix.EVFILT_READ, r.readFlags()); err != nil {
		return portErr(err)
	}
	if r.events&EventWrite != 0 {
		if err := p.change(fd, unix.EVFILT_WRITE, unix.EV_ADD); err != nil {
			p.change(fd, unix.EVFILT_READ, unix.EV_DELETE)
			return portErr(err)
		}
	}
	p.regs[fd] = r
	return nil
}

func (p *kqueuePoller) Modify(fd int, events uint32) error {
	if err := p.lockFd(fd); err != nil {
		return err
	}
	defer p.mu.Unlock()
	r, err := p.lookup(fd)
	if err != nil {
		return err
	}
	nr := &kqReg{events: events & (EventRead | EventWrite | EventClose), dev: r.dev, ino: r.ino}
	if r.events&EventRead == 0 && nr.events&EventRead == 0 && nr.events&EventClose != 0 {
		nr.hup = r.hup // the sentinel stays as it is
	}
	if nr.readFlags() != r.readFlags() {
		// EV_ADD on a live knote keeps its EV_CLEAR: replace the knote.
		p.change(fd, unix.EVFILT_READ, unix.EV_DELETE)
		if err := p.change(fd, unix.EVFILT_READ, nr.readFlags()); err != nil {
			p.change(fd, unix.EVFILT_WRITE, unix.EV_DELETE)
			delete(p.regs, fd)
			return portErr(err)
		}
	}
	switch {
	case nr.events&EventWrite != 0 && r.events&EventWrite == 0:
		if err := p.change(fd, unix.EVFILT_WRITE, unix.EV_ADD); err != nil {
			nr.events &^= EventWrite // the read side is already changed
			p.regs[fd] = nr
			return portErr(err)
		}
	case nr.events&EventWrite == 0 && r.events&EventWrite != 0:
		p.change(fd, unix.EVFILT_WRITE, unix.EV_DELETE)
	}
	p.regs[fd] = nr
	return nil
}

func (p *kqueuePoller) Remove(fd int) error {
	if err := p.lockFd(fd); err != nil {
		return err
	}
	defer p.mu.Unlock()
	r, err := p.lookup(fd)
	if err != nil {
		return err // a closed fd is forgotten too, as epoll does
	}
	p.change(fd, unix.EVFILT_READ, unix.EV_DELETE)
	if r.events&EventWrite != 0 {
		p.change(fd, unix.EVFILT_WRITE, unix.EV_DELETE)
	}
	delete(p.regs, fd)
	return nil
}

func (p *kqueuePoller) Wait(evs []Event, timeoutMs int) (int, WaitResult, error) {
	raw := rawBuf(&p.raw, evs, 2, 1) // two filters per fd, and the doorbell
	// No signal mask here: kevent has none, so a Go preemption signal
	// (SIGURG) can end the wait early with EINTR (see docs/PLATFORMS.md).
	n, err := unix.Kevent(p.kq, nil, raw, waitTimespec(waitMs(timeoutMs)))
	if err != nil {
		return waitFailed(err, unix.EBADF)
	}
	h := harvest{evs: evs}
	p.consume(raw[:n], &h)
	return h.result()
}

// consume turns the kernel's records into h: it drains the doorbell, merges
// the two knotes of one fd into one Event, and turns the hang-up sentinels
// that saw EOF level-triggered.
func (p *kqueuePoller) consume(raw []unix.Kevent_t, h *harvest) {
	clear(p.slot)
	p.rearm = p.rearm[:0]
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range raw {
		e := &raw[i]
		fd := int(e.Ident)
		filter := int(e.Filter)
		if fd == p.rfd && filter == unix.EVFILT_READ {
			h.rang(p.drain())
			continue
		}
		reg, ok := p.regs[fd]
		if !ok {
			continue // removed after the kernel queued it
		}
		bits, ok := p.events(e, reg)
		if !ok {
			continue
		}
		if j, ok := p.slot[fd]; ok {
			h.evs[j].Events |= bits
			continue
		}
		if h.add(fd, bits) {
			p.slot[fd] = h.n - 1
		}
	}
	// Sentinels that saw EOF become level-triggered, so the hang-up is
	// reported again (also when it did not fit in evs this time).
	for _, fd := range p.rearm {
		if reg, ok := p.regs[fd]; ok && reg.events&EventRead == 0 && !reg.hup {
			reg.hup = true
			p.change(fd, unix.EVFILT_READ, unix.EV_DELETE)
			p.change(fd, unix.EVFILT_READ, unix.EV_ADD)
		}
	}
}

// events translates one knote's record of registration reg into Event
// bits; false: nothing to report (an unasked filter, the sentinel's data or
// an unasked hang-up). A sentinel's first EOF is queued on rearm.
func (p *kqueuePoller) events(e *unix.Kevent_t, reg *kqReg) (uint32, bool) {
	eof := e.Flags&unix.EV_EOF != 0
	var bits uint32
	switch int(e.Filter) {
	case unix.EVFILT_READ:
		// EOF on the read side is the peer's shutdown(SHUT_WR) or
		// close: CLOSE only when asked for (data may still be
		// unread; READ reports it anyway), or with an error.
		if eof && reg.events&EventClose == 0 && e.Fflags == 0 {
			eof = false
		}
		if reg.events&EventRead != 0 {
			bits |= EventRead
		} else if !eof {
			return 0, false // the sentinel saw data, or an unasked hang-up
		} else if !reg.hup {
			p.rearm = append(p.rearm, int(e.Ident))
		}
	case unix.EVFILT_WRITE:
		if reg.events&EventWrite == 0 {
			return 0, false
		}
		bits |= EventWrite
	default:
		return 0, false
	}
	if eof {
		bits |= EventClose
		if e.Fflags != 0 {
			bits |= EventError
		}
	}
	return bits, true
}

func (p *kqueuePoller) closeAll() {
	unix.Close(p.kq)
	p.pipeBell.close()
}

func (p *kqueuePoller) Close() error { return p.shut(p.closeAll) }
