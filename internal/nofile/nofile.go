// Package nofile keeps Go's runtime from raising the host's RLIMIT_NOFILE.
//
// Go's syscall package raises the soft RLIMIT_NOFILE to the hard limit (minus
// one) when it initializes (go.dev/issue/46279): right for a Go program, wrong
// inside a C host. In a shared library that initialization runs on a thread
// of its own, concurrently with the host's main, so a host whose soft limit
// is 1024 because it uses select(2) (FD_SETSIZE) would find it at, say, 19999
// a moment later, and descriptors above 1023 overflow its fd_sets; a host
// that lowered the limit itself at the top of main saw it raised again.
//
// This package has no imports, so Go initializes it before package syscall
// (packages are initialized in import-path order among those whose imports
// are done; "github.com/..." sorts before "syscall"). Its init raises the
// soft limit to what syscall's init would set, so that init finds nothing to
// do; Restore, called by a package initialized after syscall (cabi's base),
// puts the limit found here back, unless the host has set another one in
// between (which then stays). Linux on amd64 and arm64 (raw prlimit64); a
// no-op elsewhere.
package nofile

type rlimit struct{ cur, max uint64 }

const rlimitNofile = 7 // RLIMIT_NOFILE on Linux

var (
	before rlimit // the limit found before Go could raise it
	raised bool   // init raised it: Restore has something to put back
)

func init() {
	if !supported {
		return
	}
	var cur rlimit
	if prlimit(rlimitNofile, nil, &cur) != 0 || cur.max == 0 || cur.cur >= cur.max-1 {
		return // nothing that Go's init would raise
	}
	// What syscall's init would set (Cur = Max - 1): it then leaves it.
	nl := rlimit{cur.max - 1, cur.max}
	var old rlimit
	if prlimit(rlimitNofile, &nl, &old) != 0 {
		return
	}
	before, raised = old, true
}

// Restore puts back the soft limit found before Go's initialization, if
// nothing but Go changed it since (the limit is still the one init set).
// Call once, after package syscall is initialized.
func Restore() {
	if !raised {
		return
	}
	raised = false
	var old rlimit
	if prlimit(rlimitNofile, &before, &old) != 0 {
		return
	}
	if old.cur != old.max-1 || old.max != before.max {
		// The host set a limit of its own meanwhile: that one stays.
		var x rlimit
		prlimit(rlimitNofile, &old, &x)
	}
}

// Before reports the soft and hard limits found before Go's initialization,
// and whether init changed them (for tests).
func Before() (cur, max uint64, changed bool) { return before.cur, before.max, raised }
