package libasync

import (
	"github.com/libasync/libasync/internal/boundary"
	"github.com/libasync/libasync/port"
)

// The C boundary's way in (internal/boundary): not part of the Go API.
func init() {
	boundary.NewRuntime = func(p port.Poller, src boundary.Source, sh *boundary.Shared) (any, boundary.Hooks) {
		rt := newRuntimeWithSource(p, src, sh)
		return rt, boundary.Hooks{Step: rt.step, SetMem: rt.setMem, SetRegObserver: rt.setRegObserver}
	}
}
