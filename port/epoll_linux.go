//go:build linux

package port

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

const defaultBackend = "epoll"

func init() { register("epoll", newEpoll) }

// epollPoller is level-triggered epoll with an eventfd doorbell.
//
// The doorbell alone is edge-triggered (EPOLLET): every write to it is a new
// edge, so a waiter need not read it to sleep again. The C wait of a runtime
// (cabi/internal/rt/wait.c) uses that: a ring from a post is not read, which
// saves a read(2) per wake (the completion wake row of make bench); it reads
// the counter only for an explicit wakeup. consume below still drains it:
// harmless with EPOLLET, and it is how the Go wait tells a wakeup from a ring.
//
// Each registration carries an id in the event's spare data word. epoll
// keys registrations by open file, not by number: if the host closes a
// registered fd while a dup of it lives on, the old registration stays in
// the set under that number, and once the number is reused its events would
// be taken for the new fd's. An event whose id is not the fd's current one
// is dropped; one that fires in two batches in a row is such a ghost, and
// since it cannot be deleted by number, the set is rebuilt from the live
// registrations (rare: only after a remove-before-close mistake).
type epollPoller struct {
	epfd    int
	efd     int
	guard   // mu also guards regs and epfd changes
	regs    map[int]epollReg
	nextID  int32
	rebuild bool         // a ghost was seen: rebuild the set (waiter only)
	strays  []epollStray // records of no current registration in the last consume
	fresh   []epollStray // ... and in this one
	raw     []unix.EpollEvent
	drained [8]byte
}

// epollStray is a record of no current registration: fd and id.
type epollStray struct {
	fd int
	id int32
}

type epollReg struct {
	events uint32
	id     int32
	file   epollFile // the open file the fd named when it was added
}

// epollFile tells open files apart: a rebuild must not re-add a registration
// whose number was closed and reused by another file meanwhile (the new
// file would inherit the old registration's id, and so its context, and the
// caller's own add of it would fail with EEXIST).
type epollFile struct{ dev, ino uint64 }

func identifyFile(fd int) (epollFile, bool) {
	dev, ino, ok := fileID(fd) // poll_unix.go
	return epollFile{dev, ino}, ok
}

func newEpoll() (Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(efd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, efd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(efd)
		return nil, err
	}
	return &epollPoller{epfd: epfd, efd: efd, regs: map[int]epollReg{}}, nil
}

func (p *epollPoller) Name() string { return "epoll" }

// epollBits asks for EPOLLRDHUP (the peer's read-side hang-up, e.g. its
// shutdown(SHUT_WR)) only when the registration asked for EventClose: data
// may still be unread then, and a caller that checks CLOSE first would drop
// it. EPOLLHUP (both sides hung up) and EPOLLERR always come.
func epollBits(events uint32) uint32 {
	var bits uint32
	if events&EventClose != 0 {
		bits |= unix.EPOLLRDHUP
	}
	if events&EventRead != 0 {
		bits |= unix.EPOLLIN
	}
	if events&EventWrite != 0 {
		bits |= unix.EPOLLOUT
	}
	return bits
}

func (p *epollPoller) ctl(op, fd int, events uint32) error {
	if err := p.lockFd(fd); err != nil {
		return err
	}
	defer p.mu.Unlock()
	if fd == p.efd || fd == p.epfd {
		// The poller's own descriptors are not the caller's to watch.
		if op == unix.EPOLL_CTL_ADD {
			return ErrExists
		}
		return ErrNotFound
	}
	reg := p.regs[fd]
	if op == unix.EPOLL_CTL_ADD {
		p.nextID++
		reg = epollReg{id: p.nextID}
		reg.file, _ = identifyFile(fd)
	}
	reg.events = events
	ev := unix.EpollEvent{Events: epollBits(events), Fd: int32(fd), Pad: reg.id}
	err := unix.EpollCtl(p.epfd, op, fd, &ev)
	if op == unix.EPOLL_CTL_DEL && err == unix.ENOENT {
		if _, ok := p.regs[fd]; ok {
			// Registered here, but the kernel has no registration for
			// the file the number names now: it was closed without a
			// remove and the number reused. The old registration went
			// with its file, or stays behind as a ghost while a dup
			// keeps that file open; then its records are strays from
			// now on and the set is rebuilt without it (consume). Either
			// way the caller's registration is gone: the remove worked.
			err = nil
		}
	}
	if err == nil || (op == unix.EPOLL_CTL_DEL && err == unix.EBADF) {
		if op == unix.EPOLL_CTL_DEL {
			delete(p.regs, fd)
		} else {
			p.regs[fd] = reg
		}
	}
	switch err {
	case nil:
		return nil
	case unix.EEXIST:
		return ErrExists
	case unix.ENOENT:
		return ErrNotFound
	case unix.EBADF, unix.EPERM:
		// EPERM: the fd does not support epoll (a regular file).
		return ErrBadFd
	}
	return err
}

func (p *epollPoller) Add(fd int, events uint32) error {
	return p.ctl(unix.EPOLL_CTL_ADD, fd, events)
}

func (p *epollPoller) Modify(fd int, events uint32) error {
	return p.ctl(unix.EPOLL_CTL_MOD, fd, events)
}

func (p *epollPoller) Remove(fd int) error {
	return p.ctl(unix.EPOLL_CTL_DEL, fd, 0)
}

func (p *epollPoller) Wait(evs []Event, timeoutMs int) (int, WaitResult, error) {
	// No more records than evs holds, the doorbell's included: epoll moves
	// each level-triggered record it returns behind every ready fd not yet
	// returned, so a record harvested and left out would lose its turn.
	raw := rawBuf(&p.raw, evs, 1, 0)
	n, err := p.wait(raw, waitMs(timeoutMs))
	if err != nil {
		// EINVAL: epfd is no epoll descriptor (raw's size is in range).
		return waitFailed(err, unix.EBADF, unix.EINVAL)
	}
	out, r := p.consume(raw[:n], evs)
	return out, r, nil
}

// wait is epoll_wait for a poll (ms 0), and epoll_pwait with Go's
// preemption signal blocked (see waitMask) for a wait that may sleep.
func (p *epollPoller) wait(raw []unix.EpollEvent, ms int) (int, error) {
	if ms == 0 {
		return unix.EpollWait(p.epfd, raw, 0)
	}
	var set unix.Sigset_t
	return epollPwait(p.epfd, raw, ms, waitMask(&set))
}

func (p *epollPoller) wasStray(s epollStray) bool {
	for _, o := range p.strays {
		if o == s {
			return true
		}
	}
	return false
}

// rebuildSet replaces the epoll set by a fresh one holding the doorbell and
// every live registration, which drops ghosts (see epollPoller). Called by
// the waiting thread only, between waits.
func (p *epollPoller) rebuildSet() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rebuild = false
	if p.closed {
		return
	}
	nfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return // keep the old set: ghosts are still dropped one by one
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(p.efd)}
	if unix.EpollCtl(nfd, unix.EPOLL_CTL_ADD, p.efd, &ev) != nil {
		unix.Close(nfd)
		return
	}
	for fd, reg := range p.regs {
		// Only the file that was added: a number closed without remove
		// and reused by another file is not that registration any more
		// (checked again after the add, which could race a close+reuse).
		if f, ok := identifyFile(fd); !ok || f != reg.file {
			delete(p.regs, fd)
			continue
		}
		ev := unix.EpollEvent{Events: epollBits(reg.events), Fd: int32(fd), Pad: reg.id}
		if unix.EpollCtl(nfd, unix.EPOLL_CTL_ADD, fd, &ev) != nil {
			delete(p.regs, fd) // closed meanwhile: nothing to watch
			continue
		}
		if f, ok := identifyFile(fd); !ok || f != reg.file {
			_ = unix.EpollCtl(nfd, unix.EPOLL_CTL_DEL, fd, nil)
			delete(p.regs, fd)
		}
	}
	old := p.epfd
	p.epfd = nfd
	unix.Close(old)
}

// RegID is the id fd's registration carries in its records (the high half
// of epoll_event.data; see epollPoller), if fd is registered.
func (p *epollPoller) RegID(fd int) (int32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.regs[fd]
	return r.id, ok
}

func (p *epollPoller) RawFD() int        { return p.epfd }
func (p *epollPoller) RawEventSize() int { return int(unsafe.Sizeof(unix.EpollEvent{})) }

func (p *epollPoller) ConsumeRaw(raw unsafe.Pointer, n int, evs []Event) (int, WaitResult) {
	if n <= 0 || raw == nil {
		return 0, WaitResult{}
	}
	return p.consume(unsafe.Slice((*unix.EpollEvent)(raw), n), evs)
}

func (p *epollPoller) consume(raw []unix.EpollEvent, evs []Event) (int, WaitResult) {
	h := harvest{evs: evs}
	p.mu.Lock() // regs
	p.fresh = p.fresh[:0]
	defer func() {
		p.strays, p.fresh = p.fresh, p.strays
		p.mu.Unlock()
		if p.rebuild {
			p.rebuildSet()
		}
	}()
	for i := range raw {
		e := &raw[i]
		fd := int(e.Fd)
		if fd == p.efd {
			h.rang(p.drain() >= WakeupIncrement)
			continue
		}
		if reg, ok := p.regs[fd]; !ok || reg.id != e.Pad {
			// Not the fd's current registration: usually one removed
			// (and its number maybe reused) after this batch was
			// harvested, which never fires again; a ghost (see
			// epollPoller) if it fires in the next batch too. Rebuilding
			// on a mere race would restart the turns of the ready fds.
			s := epollStray{fd, e.Pad}
			if p.wasStray(s) {
				p.rebuild = true
			}
			p.fresh = append(p.fresh, s)
			continue
		}
		h.add(fd, epollEvents(e.Events))
	}
	return h.n, h.r
}

// epollEvents translates an epoll record's bits into Event bits.
func epollEvents(bits uint32) uint32 {
	var ev uint32
	if bits&unix.EPOLLIN != 0 {
		ev |= EventRead
	}
	if bits&unix.EPOLLOUT != 0 {
		ev |= EventWrite
	}
	if bits&unix.EPOLLERR != 0 {
		ev |= EventError
	}
	if bits&(unix.EPOLLHUP|unix.EPOLLRDHUP) != 0 {
		ev |= EventClose
	}
	return ev
}

// drain reads the eventfd counter (resetting it) and returns its value.
func (p *epollPoller) drain() uint64 {
	n, err := unix.Read(p.efd, p.drained[:])
	if err != nil || n != 8 {
		return 0
	}
	return uint64(p.drained[0]) | uint64(p.drained[1])<<8 | uint64(p.drained[2])<<16 |
		uint64(p.drained[3])<<24 | uint64(p.drained[4])<<32 | uint64(p.drained[5])<<40 |
		uint64(p.drained[6])<<48 | uint64(p.drained[7])<<56
}

// write adds v to the eventfd counter.
func (p *epollPoller) write(v uint64) error {
	var b [8]byte
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	return ringFd(p.efd, b[:])
}

func (p *epollPoller) Ring() error   { return p.ring(1) }
func (p *epollPoller) Wakeup() error { return p.ring(WakeupIncrement) }

// ring writes the doorbell unless the poller is closed (its fd number may
// then belong to somebody else).
func (p *epollPoller) ring(v uint64) error {
	if err := p.lockOpen(); err != nil {
		return err
	}
	defer p.mu.Unlock()
	return p.write(v)
}

func (p *epollPoller) Doorbell() (int, int) { return p.efd, DoorbellEventfd }

func (p *epollPoller) Close() error {
	return p.shut(func() {
		unix.Close(p.epfd)
		unix.Close(p.efd)
	})
}
