#!/usr/bin/env bash
# cmake --install and CPack (README "Install"): the installed moepack runs and says what it was
# built from; the .deb and .tar.gz hold the binary and the LICENSE.
# Usage: tests/packaging/install.sh BUILD_DIR
set -euo pipefail
build=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
bin="$work/prefix/bin/moepack"
[ -x "$bin" ] || { echo "FAIL: cmake --install put no bin/moepack"; exit 1; }
[ -f "$work/prefix/share/doc/moepack/LICENSE" ] || { echo "FAIL: no LICENSE installed"; exit 1; }
version=$("$bin" --version)
echo "$version"
for field in "moepack 0." "commit " "build type " "CUDA archs "; do
  grep -q "^$field" <<<"$version" || { echo "FAIL: --version lacks '$field'"; exit 1; }
done
if grep -q "^commit unknown" <<<"$version" && git -C "$(dirname "$0")" rev-parse HEAD >/dev/null 2>&1; then
  echo "FAIL: --version names no commit in a git checkout"; exit 1
fi
# The installed binary converts the bundled sample.
src=$(cd "$(dirname "$0")/../.." && pwd)/samples/qwen3-gptq-tiny
"$bin" convert "$src" "$work/out" --json >/dev/null
(cd "$work" && cpack --config "$build/CPackConfig.cmake" -G "TGZ;DEB" -B "$work/pkg" >/dev/null)
tgz=$(ls "$work"/pkg/moepack-*.tar.gz)
deb=$(ls "$work"/pkg/moepack*.deb)
# (Listed into files first: grep -q closing a pipe early fails the lister under pipefail.)
tar -tzf "$tgz" >"$work/tgz.txt"
dpkg-deb -c "$deb" >"$work/deb.txt"
grep -q "bin/moepack$" "$work/tgz.txt" || { echo "FAIL: $tgz has no bin/moepack"; exit 1; }
grep -q "LICENSE$" "$work/tgz.txt" || { echo "FAIL: $tgz has no LICENSE"; exit 1; }
grep -q "/usr/bin/moepack$" "$work/deb.txt" || { echo "FAIL: $deb has no /usr/bin/moepack"; exit 1; }
dpkg-deb -f "$deb" Depends | grep -q libc6 || { echo "FAIL: $deb declares no libc6 dependency"; exit 1; }
echo "OK: install, $(basename "$tgz"), $(basename "$deb")"
