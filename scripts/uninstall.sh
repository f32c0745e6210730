#!/usr/bin/env bash
# Removes what `cmake --install` (make install) installed, from the list it
# wrote (build/install_manifest.txt): files and symlinks, then the package's
# own CMake directory when it is left empty. Other directories stay.
#   scripts/uninstall.sh [MANIFEST]
set -euo pipefail
manifest=${1:-build/install_manifest.txt}
if [ ! -f "$manifest" ]; then
    echo "uninstall: no $manifest (nothing was installed from this build directory)" >&2
    exit 1
fi
n=0
while IFS= read -r f || [ -n "$f" ]; do # (the list has no final newline)
    [ -n "$f" ] || continue
    if [ -e "$f" ] || [ -L "$f" ]; then
        rm -f -- "$f"
        echo "removed $f"
        n=$((n + 1))
    fi
    case "$(dirname -- "$f")" in
    */cmake/libasync) rmdir -- "$(dirname -- "$f")" 2>/dev/null || true ;;
    esac
done <"$manifest"
echo "uninstall: $n files removed"
