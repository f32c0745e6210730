//go:build windows

package port

import (
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/windows"
)

const defaultBackend = "iocp"

// DoorbellIOCP: the doorbell is an I/O completion port (Doorbell returns its
// HANDLE as an int; Windows handles fit in 32 bits). Windows has no signal
// handlers that interrupt a thread, so C code does not write this doorbell
// itself: async_runtime_wakeup calls Runtime.Wakeup through cgo
// (cabi/internal/rt/wakeup_windows.go), which posts a completion packet.
const DoorbellIOCP = 3

func init() { register("iocp", newIOCP) }

// iocpPoller is an I/O completion port that carries two kinds of packets:
//   - doorbell packets (PostQueuedCompletionStatus), coalesced so that at
//     most one Ring and one Wakeup packet are queued at any time;
//   - socket readiness, the way wepoll does it: each registered socket has
//     one IOCTL_AFD_POLL request outstanding on an \Device\Afd handle bound
//     to the port. When it completes, the waiter reports the events and
//     queues the socket to be polled again at the start of the next Wait;
//     if the socket is still ready, the new poll completes at once, which
//     makes readiness level-triggered.
//
// Descriptors are SOCKETs: the core's int fd is the SOCKET value (a kernel
// handle; handles fit in 32 bits on 64-bit Windows). Only sockets can be
// registered (ErrBadFd otherwise): pipes, consoles and files have no
// readiness on Windows.
//
// The kernel writes each poll's result into the afdSock that issued it
// (iosb, info), so an afdSock stays referenced from inflight until its
// packet is dequeued, even after Remove; Go's heap does not move objects.
type iocpPoller struct {
	iocp windows.Handle

	ringPending atomic.Bool
	wakePending atomic.Bool

	guard                         // mu also guards the fields up to ents
	socks    map[int]*afdSock     // registered sockets by fd
	inflight map[uintptr]*afdSock // outstanding polls by &iosb
	updates  []*afdSock           // to poll (again) at the next Wait
	dead     []*afdSock           // closed under us: reported until Remove
	groups   []*afdGroup

	ents []overlappedEntry // owned by the waiting thread
}

// afdGroup is one \Device\Afd handle; like wepoll, at most afdGroupSize
// sockets share one, since cancelling a poll walks the handle's requests.
type afdGroup struct {
	h windows.Handle
	n int
}

const afdGroupSize = 32

type afdSock struct {
	fd      int
	base    windows.Handle // the base provider socket (under any LSP)
	want    uint32         // EventRead|EventWrite|EventClose
	group   *afdGroup
	pending bool   // a poll is outstanding
	polled  uint32 // the AFD events it asked for
	queued  bool   // on updates
	removed bool   // Remove was called; dropped once no poll is outstanding
	dead    bool   // the socket was closed (or became unpollable)
	iosb    windows.IO_STATUS_BLOCK
	info    afdPollInfo
}

// AFD poll structures and bits (ntddafd; also used by wepoll and libuv).
type afdPollHandleInfo struct {
	Handle windows.Handle
	Events uint32
	Status windows.NTStatus
}

type afdPollInfo struct {
	Timeout         int64
	NumberOfHandles uint32
	Exclusive       uint32
	Handles         [1]afdPollHandleInfo
}

const (
	afdPollReceive     = 0x0001
	afdPollSend        = 0x0004
	afdPollDisconnect  = 0x0008
	afdPollAbort       = 0x0010
	afdPollLocalClose  = 0x0020
	afdPollAccept      = 0x0080
	afdPollConnectFail = 0x0100

	// Always asked for: error and hang-up are always reported.
	afdPollAlways = afdPollDisconnect | afdPollAbort | afdPollLocalClose | afdPollConnectFail

	ioctlAfdPoll = 0x00012024

	sioBaseHandle    = 0x48000022 // IOC_OUT|IOC_WS2|34
	sioBspHandlePoll = 0x4800001D // IOC_OUT|IOC_WS2|29

	wsaENOTSOCK = syscall.Errno(10038)
	soType      = 0x1008 // SO_TYPE
)

// Completion keys of the port's packets.
const (
	keyAFD  = 1
	keyRing = 2
	keyWake = 3
)

// overlappedEntry is OVERLAPPED_ENTRY. Overlapped is kept as an integer: it
// is only used as a key of inflight, never turned back into a pointer.
type overlappedEntry struct {
	Key        uintptr
	Overlapped uintptr
	Internal   uintptr
	Bytes      uint32
}

var (
	modntdll                  = windows.NewLazySystemDLL("ntdll.dll")
	procNtDeviceIoControlFile = modntdll.NewProc("NtDeviceIoControlFile")
	procNtCancelIoFileEx      = modntdll.NewProc("NtCancelIoFileEx")
	modkernel32               = windows.NewLazySystemDLL("kernel32.dll")
	procGQCSEx                = modkernel32.NewProc("GetQueuedCompletionStatusEx")

	wsaOnce sync.Once
	wsaErr  error

	// leaked keeps the afdSocks whose polls Close could not drain, so a
	// late kernel write never lands in reused memory.
	leakedMu sync.Mutex
	leaked   []*afdSock
)

func newIOCP() (Poller, error) {
	wsaOnce.Do(func() {
		var d windows.WSAData
		wsaErr = windows.WSAStartup(0x0202, &d)
	})
	if wsaErr != nil {
		return nil, wsaErr
	}
	h, err := windows.CreateIoCompletionPort(windows.InvalidHandle, 0, 0, 1)
	if err != nil {
		return nil, err
	}
	return &iocpPoller{iocp: h, socks: map[int]*afdSock{}, inflight: map[uintptr]*afdSock{}}, nil
}

func (p *iocpPoller) Name() string { return "iocp" }

func isSocket(fd int) bool {
	_, err := windows.GetsockoptInt(windows.Handle(uintptr(fd)), windows.SOL_SOCKET, soType)
	return err == nil
}

// baseSocket finds the base provider socket of s, below any layered service
// provider, which is what AFD polls. It fails for anything but a socket.
func baseSocket(s windows.Handle) (windows.Handle, error) {
	// Not every winsock (wine's) checks the handle in SIO_BASE_HANDLE.
	if !isSocket(int(s)) {
		return 0, ErrBadFd
	}
	for i := 0; i < 8; i++ {
		var base windows.Handle
		var n uint32
		err := windows.WSAIoctl(s, sioBaseHandle, nil, 0, (*byte)(unsafe.Pointer(&base)),
			uint32(unsafe.Sizeof(base)), &n, nil, 0)
		if err == nil {
			return base, nil
		}
		if err == wsaENOTSOCK {
			return 0, ErrBadFd
		}
		// Some LSPs block SIO_BASE_HANDLE but pass SIO_BSP_HANDLE_POLL,
		// which peels one layer: go down and ask again.
		var bsp windows.Handle
		if windows.WSAIoctl(s, sioBspHandlePoll, nil, 0, (*byte)(unsafe.Pointer(&bsp)),
			uint32(unsafe.Sizeof(bsp)), &n, nil, 0) != nil || bsp == s || bsp == 0 {
			return 0, ErrBadFd
		}
		s = bsp
	}
	return 0, ErrBadFd
}

// group returns an AFD handle with room for one more socket.
func (p *iocpPoller) group() (*afdGroup, error) {
	for _, g := range p.groups {
		if g.n < afdGroupSize {
			return g, nil
		}
	}
	name, err := windows.NewNTUnicodeString(`\Device\Afd\libasync`)
	if err != nil {
		return nil, err
	}
	oa := windows.OBJECT_ATTRIBUTES{ObjectName: name}
	oa.Length = uint32(unsafe.Sizeof(oa))
	var iosb windows.IO_STATUS_BLOCK
	var h windows.Handle
	if err := windows.NtCreateFile(&h, windows.SYNCHRONIZE, &oa, &iosb, nil, 0,
		windows.FILE_SHARE_READ|windows.FILE_SHARE_WRITE, windows.FILE_OPEN, 0, 0, 0); err != nil {
		return nil, err
	}
	if _, err := windows.CreateIoCompletionPort(h, p.iocp, keyAFD, 0); err != nil {
		windows.CloseHandle(h)
		return nil, err
	}
	// Completion packets are all we use; skip signalling the handle.
	windows.SetFileCompletionNotificationModes(h, windows.FILE_SKIP_SET_EVENT_ON_HANDLE)
	g := &afdGroup{h: h}
	p.groups = append(p.groups, g)
	return g, nil
}

func afdMask(want uint32) uint32 {
	m := uint32(afdPollAlways)
	if want&(EventRead|EventClose) == 0 {
		// The peer's disconnect (its shutdown(SD_SEND) or close, which
		// AFD does not tell apart) is READ if asked, CLOSE if asked.
		m &^= afdPollDisconnect
	}
	if want&EventRead != 0 {
		m |= afdPollReceive | afdPollAccept
	}
	if want&EventWrite != 0 {
		m |= afdPollSend
	}
	return m
}

func iosbKey(s *afdSock) uintptr { return uintptr(unsafe.Pointer(&s.iosb)) }

// submit issues s's poll. A packet follows whether it completes at once or
// later; a synchronous failure queues none.
func (p *iocpPoller) submit(s *afdSock) error {
	mask := afdMask(s.want)
	s.info = afdPollInfo{Timeout: math.MaxInt64, NumberOfHandles: 1}
	s.info.Handles[0] = afdPollHandleInfo{Handle: s.base, Events: mask}
	s.iosb = windows.IO_STATUS_BLOCK{Status: windows.STATUS_PENDING}
	size := unsafe.Sizeof(s.info)
	r, _, _ := procNtDeviceIoControlFile.Call(uintptr(s.group.h), 0, 0,
		uintptr(unsafe.Pointer(&s.iosb)), uintptr(unsafe.Pointer(&s.iosb)), ioctlAfdPoll,
		uintptr(unsafe.Pointer(&s.info)), size, uintptr(unsafe.Pointer(&s.info)), size)
	st := windows.NTStatus(uint32(r))
	if st != windows.STATUS_SUCCESS && st != windows.STATUS_PENDING {
		return st
	}
	s.pending = true
	s.polled = mask
	p.inflight[iosbKey(s)] = s
	return nil
}

// cancel asks for s's outstanding poll to complete now (with
// STATUS_CANCELLED, or with its result if it completed meanwhile).
func (p *iocpPoller) cancel(s *afdSock) {
	var iosb windows.IO_STATUS_BLOCK
	procNtCancelIoFileEx.Call(uintptr(s.group.h), uintptr(unsafe.Pointer(&s.iosb)),
		uintptr(unsafe.Pointer(&iosb)))
}

func (p *iocpPoller) queue(s *afdSock) {
	if !s.queued {
		s.queued = true
		p.updates = append(p.updates, s)
	}
}

func (p *iocpPoller) markDead(s *afdSock) {
	if !s.dead {
		s.dead = true
		p.dead = append(p.dead, s)
	}
}

// release drops a removed socket that has no poll outstanding.
func (p *iocpPoller) release(s *afdSock) {
	s.group.n--
	s.group = nil
}

func (p *iocpPoller) Add(fd int, events uint32) error {
	if err := p.lockSock(fd); err != nil {
		return err
	}
	defer p.mu.Unlock()
	if old, ok := p.socks[fd]; ok {
		if !old.dead {
			return ErrExists
		}
		// The registered socket was closed (LOCAL_CLOSE seen) and its
		// handle value now names a new socket: register that one.
		p.forget(old)
	}
	base, err := baseSocket(windows.Handle(uintptr(fd)))
	if err != nil {
		return err
	}
	g, err := p.group()
	if err != nil {
		return err
	}
	s := &afdSock{fd: fd, base: base, want: events & (EventRead | EventWrite | EventClose), group: g}
	g.n++
	if err := p.submit(s); err != nil {
		p.release(s)
		return ErrBadFd
	}
	p.socks[fd] = s
	return nil
}

// lockSock is lockOpen for a call about socket fd: ErrBadFd, without
// locking, for a negative fd.
func (p *iocpPoller) lockSock(fd int) error {
	if fd < 0 {
		return ErrBadFd
	}
	return p.lockOpen()
}

// lookup finds fd's registration for Modify and Remove and returns it with
// mu held; an error leaves mu unlocked: ErrBadFd for an fd that names no
// socket, ErrNotFound for an unregistered one.
func (p *iocpPoller) lookup(fd int) (*afdSock, error) {
	if err := p.lockSock(fd); err != nil {
		return nil, err
	}
	if s, ok := p.socks[fd]; ok {
		return s, nil
	}
	p.mu.Unlock()
	if _, err := baseSocket(windows.Handle(uintptr(fd))); err != nil {
		return nil, ErrBadFd
	}
	return nil, ErrNotFound
}

func (p *iocpPoller) Modify(fd int, events uint32) error {
	s, err := p.lookup(fd)
	if err != nil {
		return err
	}
	defer p.mu.Unlock()
	if s.dead || !isSocket(fd) {
		p.forget(s) // closed while registered: forgotten, as epoll does
		return ErrBadFd
	}
	s.want = events & (EventRead | EventWrite | EventClose)
	// A poll that asked for fewer events than now wanted is cancelled; its
	// packet makes the waiter poll again with the new set. One that asked
	// for more stays: unwanted events are filtered when it completes.
	// Without a poll outstanding the socket is already queued.
	if s.pending && afdMask(s.want)&^s.polled != 0 {
		p.cancel(s)
	}
	return nil
}

func (p *iocpPoller) Remove(fd int) error {
	s, err := p.lookup(fd)
	if err != nil {
		return err
	}
	defer p.mu.Unlock()
	p.forget(s)
	if s.dead || !isSocket(fd) {
		return ErrBadFd // closed while registered: forgotten, as epoll does
	}
	return nil
}

// forget drops a registration; its memory stays until its poll is back.
func (p *iocpPoller) forget(s *afdSock) {
	delete(p.socks, s.fd)
	if s.dead {
		for i, d := range p.dead {
			if d == s {
				p.dead = append(p.dead[:i], p.dead[i+1:]...)
				break
			}
		}
	}
	s.removed = true
	if s.pending {
		p.cancel(s) // released when its packet arrives
	} else {
		p.release(s)
	}
}

// flush polls every queued socket again. Called with mu held.
func (p *iocpPoller) flush() {
	for _, s := range p.updates {
		s.queued = false
		if s.removed || s.dead || s.pending {
			continue
		}
		if p.submit(s) != nil {
			p.markDead(s) // e.g. the socket was closed: report it
		}
	}
	clear(p.updates)
	p.updates = p.updates[:0]
}

// decode turns a completed poll into events (0: nothing to report).
func (p *iocpPoller) decode(s *afdSock) uint32 {
	st := s.iosb.Status
	if st == windows.STATUS_CANCELLED {
		return 0
	}
	if uint32(st)>>30 == 3 { // NT_ERROR: the socket is unusable
		p.markDead(s)
		return EventClose | EventError
	}
	if s.info.NumberOfHandles < 1 {
		return 0
	}
	afd := s.info.Handles[0].Events
	if afd&afdPollLocalClose != 0 {
		// Closed without Remove: nothing more to poll.
		p.markDead(s)
		return EventClose | EventError
	}
	var bits uint32
	if afd&(afdPollReceive|afdPollAccept) != 0 {
		bits |= EventRead
	}
	if afd&afdPollSend != 0 {
		bits |= EventWrite
	}
	if afd&afdPollDisconnect != 0 {
		// The read-side hang-up: recv returns 0 (READ); CLOSE only when
		// the registration asked for it, as EPOLLRDHUP on epoll.
		bits |= EventRead
		if s.want&EventClose != 0 {
			bits |= EventClose
		}
	}
	if afd&afdPollAbort != 0 {
		bits |= EventRead | EventClose | EventError
	}
	if afd&afdPollConnectFail != 0 {
		bits |= EventRead | EventWrite | EventError
	}
	return bits & (s.want | EventClose | EventError)
}

func (p *iocpPoller) Wait(evs []Event, timeoutMs int) (int, WaitResult, error) {
	h := harvest{evs: evs}
	if err := p.lockOpen(); err != nil {
		return 0, WaitResult{}, err
	}
	p.flush()
	for _, s := range p.dead {
		if !h.add(s.fd, EventClose|EventError) {
			break
		}
	}
	p.mu.Unlock()
	if h.n > 0 {
		timeoutMs = 0
	}

	ents := rawBuf(&p.ents, evs[h.n:], 1, 2) // and the two doorbell packets
	ms := uint32(windows.INFINITE)
	if timeoutMs >= 0 {
		// waitMs keeps a huge timeout a wait of at most MaxInt32 ms: in
		// 32 bits it neither wraps to 0 nor reaches INFINITE.
		ms = uint32(waitMs(timeoutMs))
	}
	var got uint32
	ok, _, err := procGQCSEx.Call(uintptr(p.iocp), uintptr(unsafe.Pointer(&ents[0])), uintptr(len(ents)),
		uintptr(unsafe.Pointer(&got)), uintptr(ms), 0)
	if ok == 0 {
		if err == windows.WAIT_TIMEOUT {
			return h.result()
		}
		return waitFailed(err, windows.ERROR_ABANDONED_WAIT_0, windows.ERROR_INVALID_HANDLE)
	}
	p.consume(ents[:got], &h)
	return h.result()
}

// consume turns dequeued packets into h: doorbell packets, and completed
// socket polls, whose sockets are queued to be polled again (readiness is
// level-triggered).
func (p *iocpPoller) consume(ents []overlappedEntry, h *harvest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range ents {
		e := &ents[i]
		switch e.Key {
		case keyRing:
			p.ringPending.Store(false)
			h.rang(false)
			continue
		case keyWake:
			p.wakePending.Store(false)
			h.rang(true)
			continue
		case keyAFD:
		default:
			continue
		}
		s := p.inflight[e.Overlapped]
		if s == nil {
			continue
		}
		delete(p.inflight, e.Overlapped)
		s.pending = false
		if s.removed {
			p.release(s)
			continue
		}
		bits := p.decode(s)
		if !s.dead {
			p.queue(s) // poll again next time: level-triggered
		}
		if bits != 0 {
			h.add(s.fd, bits)
		}
	}
}

func (p *iocpPoller) post(flag *atomic.Bool, key uintptr) error {
	if err := p.lockOpen(); err != nil {
		return err
	}
	defer p.mu.Unlock()
	if !flag.CompareAndSwap(false, true) {
		return nil // a packet is queued already: the waiter wakes anyway
	}
	if err := windows.PostQueuedCompletionStatus(p.iocp, 0, key, nil); err != nil {
		flag.Store(false)
		return err
	}
	return nil
}

func (p *iocpPoller) Ring() error   { return p.post(&p.ringPending, keyRing) }
func (p *iocpPoller) Wakeup() error { return p.post(&p.wakePending, keyWake) }

func (p *iocpPoller) Doorbell() (int, int) { return int(p.iocp), DoorbellIOCP }

func (p *iocpPoller) Close() error { return p.shut(p.closeAll) }

// closeAll cancels every outstanding poll, waits up to 2 s for their
// packets and closes the poller's handles.
func (p *iocpPoller) closeAll() {
	// Cancel every outstanding poll and collect its packet, so the kernel
	// is done with the afdSocks before they are dropped.
	for _, s := range p.inflight {
		p.cancel(s)
	}
	ents := make([]overlappedEntry, 64)
	deadline := time.Now().Add(2 * time.Second)
	for len(p.inflight) > 0 && time.Now().Before(deadline) {
		var got uint32
		ok, _, _ := procGQCSEx.Call(uintptr(p.iocp), uintptr(unsafe.Pointer(&ents[0])), uintptr(len(ents)),
			uintptr(unsafe.Pointer(&got)), 100, 0)
		if ok == 0 {
			continue
		}
		for i := 0; i < int(got); i++ {
			if ents[i].Key == keyAFD {
				delete(p.inflight, ents[i].Overlapped)
			}
		}
	}
	if len(p.inflight) > 0 {
		leakedMu.Lock()
		for _, s := range p.inflight {
			leaked = append(leaked, s)
		}
		leakedMu.Unlock()
	}
	for _, g := range p.groups {
		windows.CloseHandle(g.h)
	}
	windows.CloseHandle(p.iocp)
	p.socks, p.inflight, p.updates, p.dead, p.groups = nil, nil, nil, nil, nil
}
