#!/usr/bin/env bash
# HTTP load driver for the http rows of make bench: starts a server on
# 127.0.0.1, checks one answer with curl, loads it with wrk (1 thread, `conns`
# keep-alive connections, --latency), measures a timed phase of `secs` seconds
# once every connection has been answered, and prints one line:
#   ok=1 conns= secs= requests= req_per_s= cpu_us_per_req= cpu_sched_us_per_req=
#        server_cpu_s= p50_us= p99_us= warmup_s= wrk_requests= answer_bytes= ...
# or ok=0 error="..." when the server does not start, answers wrongly, dies,
# or wrk sees errors (socket errors or non-2xx answers).
#
# The timed phase starts when every connection has sent at least one answer
# and wrk has run 1 s (warmup_s: when that was), and lasts `secs` seconds;
# then wrk is stopped (SIGINT: it reports what it saw). Connecting and
# closing are outside it.
#   requests: answers the server sent in the timed phase: the growth of
#     bytes_sent (tcp_info, from `ss -ti`) summed over the server's side of
#     the connections, divided by the size of one answer (answer_bytes, from
#     the curl check: every answer to wrk's request is the same bytes).
#   cpu_us_per_req: utime+stime (/proc/<pid>/stat) of every process of the
#     server (the one started and its descendants, e.g. nginx's master and
#     worker; each process's figure covers all its threads) over the timed
#     phase, divided by requests. cpu_sched_us_per_req is the same from the
#     run time in /proc/<pid>/task/*/schedstat (ns resolution, live threads),
#     cpu_user_us_per_req the utime alone (the server's own code, not the
#     kernel's).
#   req_per_s: requests / the timed phase's length.
#   p50_us, p99_us: wrk's latency percentiles over its whole run;
#     wrk_requests: the answers wrk counted over its whole run.
#
# usage: http_load.sh conns secs nginx
#        http_load.sh conns secs program [args...]
#   nginx: Debian's /usr/sbin/nginx with bench/http_nginx.conf (copied next to
#     this script), written into a temporary directory with the port and the
#     body filled in; it runs as root with its pid file, error log and temp
#     paths in that directory.
#   program: a server in this script's directory; the argument PORT is
#     replaced by the port it must listen on (127.0.0.1 only).
# Environment: HTTP_PIN="W,S": wrk on CPU W, the server on CPU S ("W,": wrk
#   only); unset or empty: the OS places both.
# The body every server must answer with is the one `http_epoll --body` prints.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fail() {
  printf 'ok=0 error="%s"\n' "${*//\"/\'}"
  exit 1
}
(($# >= 3)) || { echo "usage: http_load.sh conns secs nginx|program [args...]" >&2; exit 2; }
conns=$1 secs=$2
shift 2
command -v wrk >/dev/null || fail "wrk is not installed"
ulimit -Sn "$(ulimit -Hn)" 2>/dev/null
(($(ulimit -Sn) >= conns + 64)) || fail "RLIMIT_NOFILE $(ulimit -Sn) is too low for $conns connections"

pin=${HTTP_PIN:-}
wrk_pin=() srv_pin=()
[[ -n ${pin%%,*} ]] && wrk_pin=(taskset -c "${pin%%,*}")
[[ $pin == *,* && -n ${pin#*,} ]] && srv_pin=(taskset -c "${pin#*,}")

TMP=$(mktemp -d "${TMPDIR:-/tmp}/http_load.XXXXXX") || fail "mktemp failed"
server=0
descendants() { # pid: the pid and every process below it
  local p=$1 c
  echo "$p"
  for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do descendants "$c"; done
}
alive() { # the server runs (a dead child stays a zombie until waited for)
  local l
  { read -r l <"/proc/$server/stat"; } 2>/dev/null || return 1
  l=${l##*) }
  [[ ${l:0:1} != [ZX] ]]
}
stop_server() {
  ((server > 0)) || return
  local pids i
  pids=$(descendants "$server")
  kill -TERM "$server" 2>/dev/null
  for ((i = 0; i < 30; i++)); do
    alive || break
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null
  wait "$server" 2>/dev/null
  server=0
}
trap 'stop_server; rm -rf "$TMP"' EXIT
trap 'exit 1' TERM INT

"$HERE/http_epoll" --body >"$TMP/body.expected" || fail "http_epoll --body failed"
body=$(cat "$TMP/body.expected"; echo x) # keeps a trailing newline
body=${body%x}

# A port nothing listens on, below the ephemeral range (wrk's own ports).
free_port() {
  local p
  for ((;;)); do
    p=$((20000 + RANDOM % 12000))
    [[ -z $(ss -Htln "sport = :$p" 2>/dev/null) ]] && { echo "$p"; return; }
  done
}

start_server() { # port: starts the server in the background, sets server
  local port=$1
  if [[ $prog == nginx ]]; then
    local esc=${body//\\/\\\\}
    esc=${esc//\"/\\\"}
    esc=${esc//$'\n'/\\n}
    esc=${esc//$'\r'/\\r}
    esc=${esc//$'\t'/\\t}
    mkdir -p "$TMP/nginx"
    sed -e "s|@DIR@|$TMP/nginx|g" -e "s|@PORT@|$port|g" "$HERE/http_nginx.conf" |
      awk -v b="$esc" '{ i = index($0, "@BODY@"); if (i) $0 = substr($0, 1, i - 1) b substr($0, i + 6); print }' \
        >"$TMP/nginx/nginx.conf"
    "${srv_pin[@]}" /usr/sbin/nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -e "$TMP/nginx/error.log" \
      >"$TMP/server.out" 2>&1 &
  else
    local a args=()
    for a in "${prog_args[@]}"; do args+=("${a//PORT/$port}"); done
    "${srv_pin[@]}" "$HERE/$prog" "${args[@]}" >"$TMP/server.out" 2>&1 &
  fi
  server=$!
}

# Waits until the server answers 200 with the expected body and writes the
# answer's size in bytes (head and body) to $TMP/answer.bytes; 1 if it died or
# did not answer within 10 s.
check_answer() { # port
  local i code size
  for ((i = 0; i < 100; i++)); do
    alive || return 1
    read -r code size < <(curl -s -o "$TMP/body.got" -w '%{http_code} %{size_header}\n' --max-time 2 \
      "http://127.0.0.1:$1/")
    if [[ $code == 200 ]] && cmp -s "$TMP/body.got" "$TMP/body.expected"; then
      echo $((size + $(stat -c %s "$TMP/body.got"))) >"$TMP/answer.bytes"
      return 0
    fi
    [[ $code == 000 ]] || { echo "answered $code, body $(head -c 80 "$TMP/body.got" | tr -d '\n')"; return 1; }
    sleep 0.1
  done
  return 1
}

# Over the server's established connections: "connections answered bytes",
# where answered counts those that sent something, bytes what they sent.
sent_snapshot() {
  ss -Htin state established "sport = :$port" 2>/dev/null | awk '
    { for (i = 1; i <= NF; i++) if ($i ~ /^bytes_sent:/) { split($i, a, ":"); b += a[2]; if (a[2] > 0) n++ } }
    /^[0-9]/ { c++ }
    END { printf "%d %d %.0f\n", c, n, b }'
}

cpu_snapshot() { # prints "ticks sched_ns procs threads user_ticks" over the server's processes
  local p line rest ticks=0 user=0 ns=0 procs=0 threads=0 f v
  for p in $(descendants "$server"); do
    { read -r line <"/proc/$p/stat"; } 2>/dev/null || continue
    rest=${line##*) }
    # shellcheck disable=SC2086
    set -- $rest
    ticks=$((ticks + ${12} + ${13}))
    user=$((user + ${12}))
    procs=$((procs + 1))
    for f in /proc/"$p"/task/*/schedstat; do
      { read -r v _ <"$f"; } 2>/dev/null || continue
      ns=$((ns + v))
      threads=$((threads + 1))
    done
  done
  echo "$ticks $ns $procs $threads $user"
}

to_us() { # a wrk duration (e.g. 318.00us, 1.5ms, 2.01s, 1.2m) in µs
  awk -v t="$1" 'BEGIN {
    if (t ~ /us$/) m = 1; else if (t ~ /ms$/) m = 1e3; else if (t ~ /m$/) m = 6e7; else if (t ~ /s$/) m = 1e6;
    else m = -1
    sub(/[a-z]+$/, "", t); printf "%.1f", m < 0 ? -1 : t * m }'
}

prog=$1
shift
prog_args=("$@")
[[ $prog == nginx ]] || [[ -x $HERE/$prog ]] || fail "$prog is not built"
[[ $prog != nginx ]] || [[ -x /usr/sbin/nginx ]] || fail "nginx is not installed"
started=0
for ((try = 0; try < 3 && !started; try++)); do
  port=$(free_port)
  start_server "$port"
  if why=$(check_answer "$port"); then
    started=1
  else
    [[ -n $why ]] && fail "$prog $why"
    stop_server
  fi
done
((started)) || fail "$prog did not answer on 127.0.0.1: $(cat "$TMP/server.out" "$TMP"/nginx/error.log 2>/dev/null | tail -c 300 | tr '\n"' "  ")"

# wrk runs until stopped (SIGINT: it stops and reports); the timed phase
# starts once every connection got an answer and the run is 1 s old.
"${wrk_pin[@]}" wrk -t1 -c"$conns" -d300s --timeout 10s --latency "http://127.0.0.1:$port/" >"$TMP/wrk.out" 2>&1 &
wrk=$!
trap 'kill -INT $wrk 2>/dev/null; stop_server; rm -rf "$TMP"' EXIT
w0=$(date +%s%N)
sleep 1
for ((i = 0;; i++)); do
  read -r est answered _ < <(sent_snapshot)
  ((answered >= conns)) && break
  kill -0 "$wrk" 2>/dev/null || break
  alive || fail "$prog exited during the run: $(tail -c 300 "$TMP/server.out" | tr '\n"' "  ")"
  ((i < 300)) || fail "$answered of $conns connections answered after 30 s ($est established)"
  sleep 0.1
done
read -r t0 ns0 _ _ u0 < <(cpu_snapshot)
read -r _ _ b0 < <(sent_snapshot)
w1=$(date +%s%N)
sleep "$secs"
read -r t1 ns1 procs threads u1 < <(cpu_snapshot)
read -r _ _ b1 < <(sent_snapshot)
w2=$(date +%s%N)
kill -INT "$wrk" 2>/dev/null
wait "$wrk"
wrk_rc=$?
alive || fail "$prog exited during the run: $(tail -c 300 "$TMP/server.out" | tr '\n"' "  ")"
wrk_text() { tr '\n"' "  " <"$TMP/wrk.out" | tr -s ' ' | head -c 600; }
((wrk_rc == 0)) || fail "wrk exited with status $wrk_rc: $(wrk_text)"

out=$(cat "$TMP/wrk.out")
requests=$(awk '/ requests in / { print $1 }' <<<"$out")
[[ $requests =~ ^[0-9]+$ && $requests -gt 0 ]] || fail "no request completed: $(wrk_text)"
if grep -q 'Socket errors' <<<"$out"; then
  fail "wrk: $(grep 'Socket errors' <<<"$out" | sed 's/^ *//') of $requests requests"
fi
if grep -q 'Non-2xx' <<<"$out"; then
  fail "wrk: $(grep 'Non-2xx' <<<"$out" | sed 's/^ *//') of $requests requests"
fi
p50=$(to_us "$(awk '$1 == "50%" { print $2 }' <<<"$out")")
p99=$(to_us "$(awk '$1 == "99%" { print $2 }' <<<"$out")")
hz=$(getconf CLK_TCK)
awk -v c="$conns" -v s="$secs" -v r="$requests" -v b="$((b1 - b0))" -v ab="$(cat "$TMP/answer.bytes")" \
  -v wall="$((w2 - w1))" -v warm="$((w1 - w0))" -v t="$((t1 - t0))" -v hz="$hz" -v ns="$((ns1 - ns0))" \
  -v u="$((u1 - u0))" -v p50="$p50" -v p99="$p99" -v procs="$procs" -v thr="$threads" 'BEGIN {
  n = b / ab
  if (n < 1) { printf "ok=0 error=\"no answer sent in the timed phase\"\n"; exit 1 }
  printf "ok=1 conns=%d secs=%d requests=%.0f req_per_s=%.0f cpu_us_per_req=%.3f cpu_sched_us_per_req=%.3f " \
         "cpu_user_us_per_req=%.3f server_cpu_s=%.3f p50_us=%s p99_us=%s warmup_s=%.2f wrk_requests=%d answer_bytes=%d " \
         "server_procs=%d server_threads=%d\n",
         c, s, n, n / (wall / 1e9), t / hz * 1e6 / n, ns / 1e3 / n, u / hz * 1e6 / n, t / hz, p50, p99, warm / 1e9, r, ab, procs, thr }'
