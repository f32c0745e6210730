#!/usr/bin/env bash
# Installs what building and testing libasync needs, when it is missing:
# cmake, pkg-config (make test-install) and a C/C++ compiler (and, as root, gdb for ctest tools.gdb and
# libssl-dev for the TLS cases) from Debian's packages. Go must already be on PATH. CI runs as root; as another user,
# this says what to install instead.
set -euo pipefail
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
# optional: installed when running as root, else only named. ctest
# tools.gdb runs the gdb helper in a real gdb (skipped without it); the TLS
# cases (ctests/fiber_io/tls_echo.c) and examples/fiber_tls need OpenSSL's
# headers (left out of the build without them; libasync never uses OpenSSL).
opt=()
command -v gdb >/dev/null 2>&1 || opt+=(gdb)
dpkg -s libssl-dev >/dev/null 2>&1 || opt+=(libssl-dev)
for pkg in "$@"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then
    echo "deps: go is at /usr/local/go/bin; add it to PATH" >&2
  else
    echo "deps: Go 1.26 or later is required (https://go.dev/dl/)" >&2
  fi
  exit 1
fi
if [ "$(id -u)" != 0 ] && [ ${#opt[@]} -gt 0 ]; then
  echo "deps: optional, not installed: ${opt[*]} (without gdb ctest tools.gdb is skipped, without libssl-dev the TLS cases)" >&2
  opt=()
fi
need+=(${opt[@]+"${opt[@]}"})
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "deps: missing: ${need[*]}; install them with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
