// report turns the result lines written by bench/run.sh into the markdown
// table of medians and ratios (libasync / peer), prints it, and replaces the
// generated part of docs/PERFORMANCE.md (between the bench:begin and
// bench:end markers; the rest of the file is hand-written and kept).
//
// usage: report -results FILE -machine FILE -command "make bench" [-doc docs/PERFORMANCE.md]
//
// A result line is "row=R impl=I round=N ok=1 key=value ...". The exit status
// is 1 when any program reported ok=0 (a correctness check failed or it
// crashed); a missed performance target is reported, not an error.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

// A line of the table: one metric of one row, ours against one peer.
type line struct {
	row, metric string
	what        string  // first column
	unit        string  // how the metric is shown
	scale       float64 // shown value = raw * scale
	peer        string  // impl name of the peer ("" = no peer)
	peerLabel   string
	target      string  // "ratio>=", "ratio<=", "abs<=", "all-ok" (every round ok; peerLabel says what) or "" (context only)
	limit       float64 // the target's number
	peerRow     string  // the row whose results hold the peer ("" = row)
	io          string  // if set, the server_io our runs must report ("epoll", "uring"); else the target is n/a
}

const ours = "libasync"

// The table, in display order. A row's lines may compare ours with a peer
// measured in another row (peerRow), e.g. 2 workers against the 1-thread
// raw epoll server, or 2 of our workers against 1 of ours (peer "libasync"
// in another row).
var table = []line{
	{"completions", "msgs_per_s", "completions: 4 producer threads post, main thread drains", "M msg/s", 1e-6,
		"libuv", "libuv: lock-free stack + uv_async_send", "ratio>=", 1.0, "", ""},
	{"completions", "wakes_per_msg", "completions: wake syscalls (write) per msg, in-process count", "syscalls/msg", 1,
		"libuv", "libuv: lock-free stack + uv_async_send", "abs<=", 0.01, "", ""},
	{"completions", "ok", "completions: every payload delivered once, in order per producer", "rounds ok", 1,
		"", "every payload, every round", "all-ok", 0, "", ""},
	{"completions_strace", "writes_per_msg", "completions under strace -f: write per msg", "syscalls/msg", 1,
		"libuv", "libuv", "", 0, "", ""},
	{"completions_strace", "futex_per_msg", "completions under strace -f: futex per msg", "syscalls/msg", 1,
		"libuv", "libuv", "", 0, "", ""},
	{"latency", "p50_us", "completion wake latency, idle loop: p50", "µs", 1,
		"eventfd", "raw eventfd + epoll_wait", "ratio<=", 1.1, "", ""},
	{"latency", "p50_us", "completion wake latency, idle loop: p50", "µs", 1,
		"libuv", "libuv uv_async_send", "", 0, "", ""},
	{"latency", "p99_us", "completion wake latency, idle loop: p99", "µs", 1,
		"libuv", "libuv uv_async_send", "ratio<=", 1.0, "", ""},
	{"latency", "p99_us", "completion wake latency, idle loop: p99", "µs", 1,
		"eventfd", "raw eventfd + epoll_wait", "", 0, "", ""},
	{"fdlatency", "p50_us", "fd readiness wake latency (pipe byte -> wait returns), idle loop: p50", "µs", 1,
		"epoll", "raw epoll_wait on the pipe", "ratio<=", 1.2, "", ""},
	{"fdlatency", "p99_us", "fd readiness wake latency (pipe byte -> wait returns), idle loop: p99", "µs", 1,
		"epoll", "raw epoll_wait on the pipe", "", 0, "", ""},
	{"queue_1p1c", "msgs_per_s", "queue enqueue+dequeue, 1P1C, 16 B msgs, capacity 1024", "M msg/s", 1e-6,
		"ring", "C ring: mutex + 2 condvars", "ratio>=", 1.0, "", ""},
	{"queue_1p1c", "msgs_per_s", "queue enqueue+dequeue, 1P1C, 16 B msgs, capacity 1024", "M msg/s", 1e-6,
		"gochan", "Go buffered channel", "", 0, "", ""},
	{"queue_4p1c", "msgs_per_s", "queue enqueue+dequeue, 4P1C, 16 B msgs, capacity 1024", "M msg/s", 1e-6,
		"ring", "C ring: mutex + 2 condvars", "ratio>=", 1.0, "", ""},
	{"queue_4p1c", "msgs_per_s", "queue enqueue+dequeue, 4P1C, 16 B msgs, capacity 1024", "M msg/s", 1e-6,
		"gochan", "Go buffered channel", "", 0, "", ""},
	{"offload", "p50_us", "offload: submit to completion on the loop, one at a time (async_runtime_submit_work): p50", "µs", 1,
		"libuv", "libuv uv_queue_work (4 pool threads)", "ratio<=", 1.0, "", ""},
	{"offload", "p99_us", "offload: submit to completion on the loop, one at a time: p99", "µs", 1,
		"libuv", "libuv uv_queue_work (4 pool threads)", "", 0, "", ""},
	{"offload", "items_per_s", "offload: throughput, 256 items in flight, trivial function", "k items/s", 1e-3,
		"libuv", "libuv uv_queue_work (4 pool threads)", "", 0, "", ""},
	{"timers", "ns_per_op", "timers: start 1M then cancel 1M (warm pass), per op", "ns/op", 1,
		"libuv", "libuv uv_timer_start/stop", "ratio<=", 0.25, "", ""},
	{"timers", "ns_per_op", "timers: start 1M then cancel 1M (warm pass), per op", "ns/op", 1,
		"gotimers", "Go time.AfterFunc/Stop", "", 0, "", ""},
	{"timers", "start_ns", "timers: start only (warm)", "ns/op", 1, "libuv", "libuv uv_timer_init+start", "", 0, "", ""},
	{"timers", "cancel_ns", "timers: cancel only (warm)", "ns/op", 1, "libuv", "libuv uv_timer_stop", "", 0, "", ""},
	{"timers", "cold_ns_per_op", "timers: first pass on fresh memory, per op", "ns/op", 1,
		"libuv", "libuv uv_timer_start/stop", "", 0, "", ""},
	{"cgo", "c_call_ns", "C boundary: a call the C half answers (async_last_error)", "ns", 1, "", "", "", 0, "", ""},
	{"cgo", "go_call_ns", "C boundary: a trivial call into Go (a handle lookup: async_runtime_cancel_timer, dead runtime)", "ns", 1, "", "", "", 0, "", ""},
	{"cgo", "first_call_us", "C boundary: first call into Go from a new thread", "µs", 1, "", "", "", 0, "", ""},
	{"cgo", "post_ns", "post_completion, one thread, no waiter", "ns", 1, "", "", "", 0, "", ""},

	{"fiber_yield", "ns_per_yield", "fiber yield, 2 fibers on 1 thread", "ns/yield", 1,
		"boostfiber", "Boost.Fiber this_fiber::yield", "ratio<=", 1.0, "", ""},
	{"fiber_yield", "ns_per_yield", "fiber yield, 2 fibers on 1 thread", "ns/yield", 1,
		"go1", "Go runtime.Gosched, GOMAXPROCS=1", "ratio<=", 0.6, "", ""},
	{"fiber_yield_2w", "ns_per_yield", "fiber yield, 4 fibers on 2 workers", "ns/yield", 1,
		"go2", "Go runtime.Gosched, GOMAXPROCS=2", "", 0, "", ""},
	{"fiber_spawn", "ns_per_fiber", "fiber spawn+complete, batches of 100 joined, 1 thread", "ns/fiber", 1,
		"go1", "Go goroutine + WaitGroup, GOMAXPROCS=1", "ratio<=", 0.3, "", ""},
	{"fiber_spawn", "ns_per_fiber", "fiber spawn+complete, batches of 100 joined, 1 thread", "ns/fiber", 1,
		"boostfiber", "Boost.Fiber fiber + join (pooled stacks)", "", 0, "", ""},
	{"fiber_spawn_2w", "ns_per_fiber", "fiber spawn+complete, 2 workers", "ns/fiber", 1,
		"go2", "Go goroutine + WaitGroup, GOMAXPROCS=2", "ratio<=", 1.0, "", ""},
	{"fiber_pingpong", "ns_per_rt", "channel ping-pong, capacity 0, 1 thread, 1M round trips", "ns/round trip", 1,
		"go1", "Go unbuffered channel, GOMAXPROCS=1", "ratio<=", 0.8, "", ""},
	{"fiber_pingpong", "ns_per_rt", "channel ping-pong, capacity 0, 1 thread, 1M round trips", "ns/round trip", 1,
		"boostfiber", "Boost.Fiber unbuffered_channel", "", 0, "", ""},
	{"fiber_pingpong_timed", "ns_per_rt", "channel ping-pong, 1 thread, every op with a 10 s timeout", "ns/round trip", 1,
		"go1", "Go unbuffered channel, GOMAXPROCS=1", "", 0, "fiber_pingpong", ""},
	{"fiber_pingpong_2w", "ns_per_rt", "channel ping-pong, 2 workers, 200k round trips", "ns/round trip", 1,
		"go2", "Go unbuffered channel, GOMAXPROCS=2", "ratio<=", 1.0, "", ""},
	{"fiber_parked", "rss_per_fiber_b", "parked fibers (100k, 16 KiB stacks): RSS per fiber", "KiB", 1.0 / 1024,
		"go1", "Go goroutines blocked on a channel", "abs<=", 8, "", ""},
	{"fiber_parked", "create_ns", "parked fibers (100k): creation time per fiber", "µs", 1e-3,
		"go1", "Go goroutines", "", 0, "", ""},
	{"fiber_cancel_scope", "cancel_ms", "cancelling a scope of 10k parked fibers (10 nested scopes), 1 worker: time until all returned", "ms", 1,
		"", "", "", 0, "", ""},
	{"fiber_cancel_scope_2w", "cancel_ms", "cancelling a scope of 10k parked fibers (10 nested scopes), 2 workers: time until all returned", "ms", 1,
		"", "", "", 0, "", ""},
	{"fib_100k_2w", "ok", "100k fibers each fib(20) then 10 yields, 2 workers: every fiber completed with the right result", "rounds ok", 1,
		"", "every fiber, every round", "all-ok", 0, "", ""},
	{"fib_100k_2w", "spread", "100k fibers each fib(20) then 10 yields, 2 workers: fibers started per worker, the worst worker's share against an even one", "× even", 1,
		"", "", "abs<=", 2.0, "", ""},
	{"fib_100k_2w", "run_spread", "100k fibers each fib(20) then 10 yields, 2 workers: fiber resumes per worker, the worst against an even share", "× even", 1,
		"", "", "", 0, "", ""},
	{"fib_100k_2w", "secs", "100k fibers each fib(20) then 10 yields, 2 workers: time until all completed", "s", 1,
		"", "", "", 0, "", ""},
	{"fiber_parked_1m", "rss_per_fiber_b", "1M parked fibers (one run): RSS per fiber", "KiB", 1.0 / 1024,
		"go1", "Go goroutines blocked on a channel", "abs<=", 8, "", ""},
	{"fiber_parked_1m", "create_ns", "1M parked fibers (one run): creation time per fiber", "µs", 1e-3,
		"go1", "Go goroutines", "", 0, "", ""},
}

// The TCP echo lines, the same for 1k and 10k connections. Three rows each:
// ours with 1 worker on the default (epoll) path against the 1-thread peers;
// ours with 2 workers against ours with 1 (and the Go and epoll context);
// ours with ASYNC_FIBER_IO=uring against the io_uring peer. Our lines name
// the I/O path they stand for (io): tcp_client reports the path the server
// really used (server_io), and a line whose runs took another one gets no
// verdict.
func init() {
	const (
		epoll = "raw epoll server, 1 thread"
		uring = "io_uring server (liburing), 1 thread"
		uv    = "libuv server (static buffer, uv_try_write)"
	)
	for _, c := range []struct{ row, what string }{{"echo_1k", "1k conns x 30"}, {"echo_10k", "10k conns x 5"}} {
		w := "TCP echo " + c.what + " round trips, 64 B: "
		w2 := "TCP echo " + c.what + ", 2 workers: "
		wu := "TCP echo " + c.what + ", ASYNC_FIBER_IO=uring: "
		r2, ru := c.row+"_2w", c.row+"_uring"
		table = append(table,
			line{c.row, "cpu_us_per_rt", w + "server CPU per round trip", "µs", 1, "epoll", epoll, "ratio<=", 1.05, "", "epoll"},
			line{c.row, "cpu_us_per_rt", w + "server CPU per round trip", "µs", 1, "uring", uring, "", 0, ru, "epoll"},
			line{c.row, "cpu_us_per_rt", w + "server CPU per round trip", "µs", 1, "libuv", uv, "", 0, "", "epoll"},
			line{c.row, "cpu_us_per_rt", w + "server CPU per round trip", "µs", 1, "go1", "Go net, GOMAXPROCS=1", "", 0, "", "epoll"},
			line{c.row, "p99_us", w + "p99 round trip", "ms", 1e-3, "epoll", epoll, "ratio<=", 1.0, "", "epoll"},
			line{c.row, "p99_us", w + "p99 round trip", "ms", 1e-3, "uring", uring, "", 0, ru, "epoll"},
			line{c.row, "p99_us", w + "p99 round trip", "ms", 1e-3, "libuv", uv, "", 0, "", "epoll"},
			line{c.row, "p99_us", w + "p99 round trip", "ms", 1e-3, "go1", "Go net, GOMAXPROCS=1", "", 0, "", "epoll"},
			line{c.row, "rt_per_s", w + "round trips per second", "k/s", 1e-3, "epoll", epoll, "", 0, "", "epoll"},
			line{r2, "cpu_us_per_rt", w2 + "server CPU per round trip", "µs", 1, ours, "libasync, 1 worker", "ratio<=", 1.0, c.row, "epoll"},
			line{r2, "cpu_us_per_rt", w2 + "server CPU per round trip", "µs", 1, "epoll", epoll, "", 0, c.row, "epoll"},
			line{r2, "cpu_us_per_rt", w2 + "server CPU per round trip", "µs", 1, "go2", "Go net, GOMAXPROCS=2", "", 0, "", "epoll"},
			line{r2, "p99_us", w2 + "p99 round trip", "ms", 1e-3, ours, "libasync, 1 worker", "", 0, c.row, "epoll"},
			line{r2, "p99_us", w2 + "p99 round trip", "ms", 1e-3, "epoll", epoll, "", 0, c.row, "epoll"},
			line{r2, "p99_us", w2 + "p99 round trip", "ms", 1e-3, "go2", "Go net, GOMAXPROCS=2", "", 0, "", "epoll"},
			line{ru, "cpu_us_per_rt", wu + "server CPU per round trip", "µs", 1, "uring", uring, "ratio<=", 1.05, "", "uring"},
			line{ru, "cpu_us_per_rt", wu + "server CPU per round trip", "µs", 1, "epoll", epoll, "", 0, c.row, "uring"},
			line{ru, "p99_us", wu + "p99 round trip", "ms", 1e-3, "epoll", epoll, "ratio<=", 1.0, c.row, "uring"},
			line{ru, "p99_us", wu + "p99 round trip", "ms", 1e-3, "uring", uring, "", 0, "", "uring"},
			line{ru, "rt_per_s", wu + "round trips per second", "k/s", 1e-3, "uring", uring, "", 0, "", "uring"},
		)
	}
}

// The HTTP lines, the same for 100 and 10k connections: ours with 1 worker
// against nginx with 1 worker and against the raw epoll server that uses the
// same parser and answer; then ours with 2 workers at 100 connections, as
// context against the 1-worker runs.
func init() {
	const (
		nginx = "nginx, 1 worker (return 200)"
		epoll = "raw epoll server, same parser, 1 thread"
	)
	for _, c := range []struct{ row, what string }{{"http_100", "100 conns"}, {"http_10k", "10k conns"}} {
		w := "HTTP/1.1 keep-alive GET, " + c.what + " (wrk, 1 thread), 1 worker: "
		table = append(table,
			line{c.row, "cpu_us_per_req", w + "server CPU per request", "µs", 1, "nginx", nginx, "ratio<=", 1.0, "", ""},
			line{c.row, "cpu_us_per_req", w + "server CPU per request", "µs", 1, "epoll", epoll, "ratio<=", 1.05, "", ""},
			line{c.row, "p99_us", w + "p99 latency", "ms", 1e-3, "nginx", nginx, "ratio<=", 1.1, "", ""},
			line{c.row, "p99_us", w + "p99 latency", "ms", 1e-3, "epoll", epoll, "", 0, "", ""},
			line{c.row, "req_per_s", w + "requests per second", "k/s", 1e-3, "nginx", nginx, "", 0, "", ""},
			line{c.row, "req_per_s", w + "requests per second", "k/s", 1e-3, "epoll", epoll, "", 0, "", ""},
		)
	}
	w2 := "HTTP/1.1 keep-alive GET, 100 conns (wrk, 1 thread), 2 workers: "
	table = append(table,
		line{"http_100_2w", "cpu_us_per_req", w2 + "server CPU per request", "µs", 1, ours, "libasync, 1 worker", "", 0, "http_100", ""},
		line{"http_100_2w", "cpu_us_per_req", w2 + "server CPU per request", "µs", 1, "nginx", nginx, "", 0, "http_100", ""},
		line{"http_100_2w", "p99_us", w2 + "p99 latency", "ms", 1e-3, ours, "libasync, 1 worker", "", 0, "http_100", ""},
		line{"http_100_2w", "p99_us", w2 + "p99 latency", "ms", 1e-3, "nginx", nginx, "", 0, "http_100", ""},
		line{"http_100_2w", "req_per_s", w2 + "requests per second", "k/s", 1e-3, ours, "libasync, 1 worker", "", 0, "http_100", ""},
	)
}

type result struct {
	ok     bool
	fields map[string]string
}

// results[row][impl] = one entry per round
type results map[string]map[string][]result

func parseLine(s string) map[string]string {
	m := map[string]string{}
	for len(s) > 0 {
		s = strings.TrimLeft(s, " \t")
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			break
		}
		k := s[:eq]
		s = s[eq+1:]
		var v string
		if strings.HasPrefix(s, "\"") {
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				v, s = s[1:], ""
			} else {
				v, s = s[1:1+end], s[2+end:]
			}
		} else {
			sp := strings.IndexAny(s, " \t")
			if sp < 0 {
				v, s = s, ""
			} else {
				v, s = s[:sp], s[sp:]
			}
		}
		m[k] = v
	}
	return m
}

func load(path string) (results, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	res := results{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := parseLine(sc.Text())
		row, impl := m["row"], m["impl"]
		if row == "" || impl == "" {
			continue
		}
		if res[row] == nil {
			res[row] = map[string][]result{}
		}
		res[row][impl] = append(res[row][impl], result{ok: m["ok"] == "1", fields: m})
	}
	return res, sc.Err()
}

// median of the metric over the rounds that passed; ok=false if none did.
func median(rs []result, metric string) (float64, float64, float64, bool) {
	var v []float64
	for _, r := range rs {
		if !r.ok {
			continue
		}
		if x, err := strconv.ParseFloat(r.fields[metric], 64); err == nil && x >= 0 {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return 0, 0, 0, false
	}
	sort.Float64s(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return m, v[0], v[len(v)-1], true
}

func num(x float64) string {
	a := math.Abs(x)
	switch {
	case x == 0:
		return "0"
	case a >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(x, 'f', 2, 64)
	default:
		return strconv.FormatFloat(x, 'g', 2, 64)
	}
}

func cell(rs []result, l line) (string, float64, bool) {
	if len(rs) == 0 {
		return "not run", 0, false
	}
	failed := 0
	for _, r := range rs {
		if !r.ok {
			failed++
		}
	}
	m, lo, hi, ok := median(rs, l.metric)
	if !ok {
		return fmt.Sprintf("FAIL (%d/%d rounds)", failed, len(rs)), 0, false
	}
	s := num(m * l.scale)
	if len(rs) > 1 && hi > lo {
		s += fmt.Sprintf(" (%s–%s)", num(lo*l.scale), num(hi*l.scale))
	}
	if failed > 0 {
		s += fmt.Sprintf(" FAIL in %d/%d rounds", failed, len(rs))
	}
	return s, m, failed == 0
}

// ioPaths is the sorted set of server_io values reported by the rounds that
// passed, e.g. "epoll" or "epoll,uring"; "" when none reported one.
func ioPaths(rs []result) string {
	seen := map[string]bool{}
	var v []string
	for _, r := range rs {
		if io := r.fields["server_io"]; r.ok && io != "" && !seen[io] {
			seen[io] = true
			v = append(v, io)
		}
	}
	sort.Strings(v)
	return strings.Join(v, ",")
}

func render(res results, machine, command string) (string, bool) {
	var b strings.Builder
	allOK := true
	for _, byImpl := range res {
		for _, rs := range byImpl {
			for _, r := range rs {
				if !r.ok {
					allOK = false
				}
			}
		}
	}
	rounds := 0
	for _, byImpl := range res {
		for _, rs := range byImpl {
			rounds = max(rounds, len(rs))
		}
	}
	fmt.Fprintf(&b, "Made by `%s` (%d interleaved rounds; each cell is the median, with the min–max over rounds in brackets).\n\n", command, rounds)
	b.WriteString("| what | unit | libasync | peer | peer value | libasync / peer | target | met |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, l := range table {
		byImpl := res[l.row]
		if byImpl == nil {
			continue
		}
		var oursCell string
		var ov float64
		var oursOK bool
		if l.target == "all-ok" {
			n, good := 0, 0
			for _, r := range byImpl[ours] {
				n++
				if r.ok {
					good++
				}
			}
			oursCell, oursOK = fmt.Sprintf("%d/%d", good, n), n > 0 && good == n
			met := "yes"
			if !oursOK {
				met = "**FAIL**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | | | | %s | %s |\n", l.what, l.unit, oursCell, l.peerLabel, met)
			continue
		}
		oursCell, ov, oursOK = cell(byImpl[ours], l)
		peerCell, ratioCell, targetCell, met := "", "", "", ""
		// Our runs took another I/O path than the line stands for (e.g.
		// ASYNC_FIBER_IO=uring asked, epoll ran): numbers shown, no verdict.
		wrongIO := ""
		if got := ioPaths(byImpl[ours]); l.io != "" && got != "" && got != l.io {
			wrongIO = got
			oursCell += " [ran the " + got + " path]"
		}
		var pv float64
		peerOK := false
		if l.peer != "" {
			peerImpls := byImpl
			if l.peerRow != "" {
				peerImpls = res[l.peerRow]
			}
			peerCell, pv, peerOK = cell(peerImpls[l.peer], l)
			if oursOK && peerOK && pv > 0 {
				ratioCell = num(ov/pv) + "×"
			}
		}
		switch l.target {
		case "ratio>=", "ratio<=":
			op := map[string]string{"ratio>=": "≥", "ratio<=": "≤"}[l.target]
			targetCell = fmt.Sprintf("%s %s×", op, num(l.limit))
			if oursOK && peerOK && pv > 0 {
				r := ov / pv
				if (l.target == "ratio>=" && r >= l.limit) || (l.target == "ratio<=" && r <= l.limit) {
					met = "yes"
				} else {
					met = "**no**"
				}
			} else {
				met = "n/a"
			}
		case "abs<=":
			targetCell = fmt.Sprintf("≤ %s", num(l.limit))
			if oursOK {
				if ov*l.scale <= l.limit {
					met = "yes"
				} else {
					met = "**no**"
				}
			} else {
				met = "n/a"
			}
		default:
			targetCell = "(context)"
		}
		if wrongIO != "" && l.target != "" {
			met = "n/a (" + wrongIO + " path ran, not " + l.io + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", l.what, l.unit, oursCell, l.peerLabel, peerCell,
			ratioCell, targetCell, met)
	}
	if machine != "" {
		b.WriteString("\n| machine | |\n|---|---|\n")
		for _, ml := range strings.Split(strings.TrimSpace(machine), "\n") {
			k, v, found := strings.Cut(ml, ":")
			if found {
				fmt.Fprintf(&b, "| %s | %s |\n", strings.TrimSpace(k), strings.TrimSpace(v))
			}
		}
	}
	return b.String(), allOK
}

const (
	begin = "<!-- bench:begin (generated by bench/run.sh; edits here are overwritten) -->"
	end   = "<!-- bench:end -->"
)

func updateDoc(path, generated string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	text := string(old)
	i, j := strings.Index(text, begin), strings.Index(text, end)
	block := begin + "\n" + generated + end
	if i >= 0 && j > i {
		text = text[:i] + block + text[j+len(end):]
	} else {
		text = "# Performance\n\n" + block + "\n" + text
	}
	return os.WriteFile(path, []byte(text), 0o644)
}

func main() {
	resultsPath := flag.String("results", "", "result lines from run.sh")
	machinePath := flag.String("machine", "", "machine details, \"key: value\" lines")
	command := flag.String("command", "make bench", "the command that made the results")
	doc := flag.String("doc", "", "markdown file whose generated part is replaced (optional)")
	flag.Parse()
	res, err := load(*resultsPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(2)
	}
	machine := ""
	if *machinePath != "" {
		if m, err := os.ReadFile(*machinePath); err == nil {
			machine = string(m)
		}
	}
	out, allOK := render(res, machine, *command)
	fmt.Print(out)
	if *doc != "" {
		if err := updateDoc(*doc, out); err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
			os.Exit(2)
		}
	}
	if !allOK {
		fmt.Fprintln(os.Stderr, "report: at least one benchmark FAILED its correctness check (see ok=0 lines)")
		os.Exit(1)
	}
}
