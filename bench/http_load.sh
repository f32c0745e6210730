#!/usr/bin/env bash
# HTTP load driver for the http rows of make bench: starts a server on
# 127.0.0.1, checks one answer with curl, loads it with wrk (1 thread, `conns`
# keep-alive connections, `secs` seconds, --latency) and prints one line:
#   ok=1 conns= secs= requests= req_per_s= cpu_us_per_req= cpu_sched_us_per_req=
#        server_cpu_s= p50_us= p99_us= server_procs= server_threads=
# or ok=0 error="..." when the server does not start, answers wrongly, dies,
# or wrk sees errors (socket errors or non-2xx answers).
#
# cpu_us_per_req: utime+stime (/proc/<pid>/stat) of every process of the
#   server (the one started and its descendants, e.g. nginx's master and
#   worker; each process's figure covers all its threads) over the timed
#   phase, divided by the requests wrk completed. The timed phase runs from
#   just before wrk starts until wrk has exited and the server holds no
#   connection from it any more: it includes accepting and closing the
#   connections. cpu_sched_us_per_req is the same from the run time in
#   /proc/<pid>/task/*/schedstat (ns resolution, live threads only).
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

# Waits until the server answers 200 with the expected body; 1 if it died
# or did not answer within 10 s.
check_answer() { # port
  local i code
  for ((i = 0; i < 100; i++)); do
    alive || return 1
    code=$(curl -s -o "$TMP/body.got" -w '%{http_code}' --max-time 2 "http://127.0.0.1:$1/") &&
      [[ $code == 200 ]] && cmp -s "$TMP/body.got" "$TMP/body.expected" && return 0
    [[ $code == 000 ]] || { echo "answered $code, body $(head -c 80 "$TMP/body.got" | tr -d '\n')"; return 1; }
    sleep 0.1
  done
  return 1
}

cpu_snapshot() { # prints "ticks sched_ns procs threads" over the server's processes
  local p line rest ticks=0 ns=0 procs=0 threads=0 f v
  for p in $(descendants "$server"); do
    { read -r line <"/proc/$p/stat"; } 2>/dev/null || continue
    rest=${line##*) }
    # shellcheck disable=SC2086
    set -- $rest
    ticks=$((ticks + ${12} + ${13}))
    procs=$((procs + 1))
    for f in /proc/"$p"/task/*/schedstat; do
      { read -r v _ <"$f"; } 2>/dev/null || continue
      ns=$((ns + v))
      threads=$((threads + 1))
    done
  done
  echo "$ticks $ns $procs $threads"
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

read -r t0 ns0 _ _ < <(cpu_snapshot)
"${wrk_pin[@]}" wrk -t1 -c"$conns" -d"${secs}s" --timeout 10s --latency "http://127.0.0.1:$port/" >"$TMP/wrk.out" 2>&1
wrk_rc=$?
for ((i = 0; i < 50; i++)); do # until the server has closed wrk's connections (at most 5 s)
  [[ -z $(ss -Htn state established state close-wait "sport = :$port" 2>/dev/null | head -n1) ]] && break
  sleep 0.1
done
read -r t1 ns1 procs threads < <(cpu_snapshot)
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
rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
p50=$(to_us "$(awk '$1 == "50%" { print $2 }' <<<"$out")")
p99=$(to_us "$(awk '$1 == "99%" { print $2 }' <<<"$out")")
hz=$(getconf CLK_TCK)
awk -v c="$conns" -v s="$secs" -v r="$requests" -v rps="$rps" -v t="$((t1 - t0))" -v hz="$hz" \
  -v ns="$((ns1 - ns0))" -v p50="$p50" -v p99="$p99" -v procs="$procs" -v thr="$threads" 'BEGIN {
  printf "ok=1 conns=%d secs=%d requests=%d req_per_s=%.0f cpu_us_per_req=%.3f cpu_sched_us_per_req=%.3f " \
         "server_cpu_s=%.3f p50_us=%s p99_us=%s server_procs=%d server_threads=%d\n",
         c, s, r, rps, t / hz * 1e6 / r, ns / 1e3 / r, t / hz, p50, p99, procs, thr }'
