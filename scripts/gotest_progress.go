//go:build ignore

// gotest_progress turns `go test -json` (on stdin) into a short report that
// shows progress (make test-go):
//
//	go test: start <package>            when a package's tests start
//	ok   <package> 12.3s (N tests)      when they pass
//	--- FAIL: <test> and its output     when a test fails; FAIL <package>
//	go test: 1m30s, running <package> <test> (45s)
//	                                    after GOTEST_TICK seconds (default
//	                                    30) without another line
//
// Lines that are not JSON (build errors) and build output pass through.
// Exits 1 if a test, a package or a build failed, or if the input held no
// package result at all.
//
//	go test -json ./... | go run scripts/gotest_progress.go
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type pkgState struct {
	running map[string]time.Time // tests started and not ended
	out     map[string][]string  // output of the running tests
	pkgOut  []string             // output outside any test
	passed  int
}

const keepLines = 200 // of one test's (or package's) output, the last ones

func appendLine(l []string, s string) []string {
	l = append(l, s)
	if len(l) > keepLines {
		l = l[len(l)-keepLines:]
	}
	return l
}

func main() {
	tick := 30 * time.Second
	if s, err := strconv.Atoi(os.Getenv("GOTEST_TICK")); err == nil && s > 0 {
		tick = time.Duration(s) * time.Second
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	t0 := time.Now()
	last := t0
	pkgs := map[string]*pkgState{}
	get := func(p string) *pkgState {
		st := pkgs[p]
		if st == nil {
			st = &pkgState{running: map[string]time.Time{}, out: map[string][]string{}}
			pkgs[p] = st
		}
		return st
	}
	say := func(format string, a ...any) {
		fmt.Printf(format+"\n", a...)
		last = time.Now()
	}
	failed, results := false, 0
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				if results == 0 {
					say("go test: no package result (see the lines above)")
					failed = true
				}
				if failed {
					os.Exit(1)
				}
				return
			}
			var e event
			if !strings.HasPrefix(l, "{") || json.Unmarshal([]byte(l), &e) != nil {
				say("%s", l)
				continue
			}
			st := get(e.Package)
			switch e.Action {
			case "start":
				say("go test: start %s", e.Package)
			case "run":
				st.running[e.Test] = time.Now()
			case "output":
				if e.Test != "" {
					st.out[e.Test] = appendLine(st.out[e.Test], strings.TrimRight(e.Output, "\n"))
				} else {
					st.pkgOut = appendLine(st.pkgOut, strings.TrimRight(e.Output, "\n"))
				}
			case "build-output":
				say("%s", strings.TrimRight(e.Output, "\n"))
			case "build-fail":
				failed = true
			case "pass", "skip", "fail":
				if e.Test != "" {
					if e.Action == "fail" {
						failed = true
						say("--- FAIL: %s (%s, %.1fs)", e.Test, e.Package, e.Elapsed)
						for _, o := range st.out[e.Test] {
							say("    %s", o)
						}
					} else if e.Action == "pass" {
						st.passed++
					}
					delete(st.running, e.Test)
					delete(st.out, e.Test)
					break
				}
				results++
				if e.Action == "fail" {
					failed = true
					for _, o := range st.pkgOut {
						say("    %s", o)
					}
					say("FAIL %s %.1fs", e.Package, e.Elapsed)
				} else if e.Action == "skip" {
					say("--   %s (no tests)", e.Package)
				} else {
					say("ok   %s %.1fs (%d tests)", e.Package, e.Elapsed, st.passed)
				}
				delete(pkgs, e.Package)
			}
		case now := <-ticker.C:
			if now.Sub(last) < tick {
				continue
			}
			what := "building"
			var oldest time.Time
			names := make([]string, 0, len(pkgs))
			for p := range pkgs {
				names = append(names, p)
			}
			sort.Strings(names)
			for _, p := range names {
				for t, at := range pkgs[p].running {
					if oldest.IsZero() || at.Before(oldest) {
						oldest = at
						what = fmt.Sprintf("running %s %s (%ds)", p, t, int(now.Sub(at).Seconds()))
					}
				}
			}
			say("go test: %s, %s", now.Sub(t0).Round(time.Second), what)
		}
	}
}
