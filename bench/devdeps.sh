#!/usr/bin/env bash
# Assembles .devdeps/, what the device machine (no package registry) needs to build moepack and
# its tests, from this machine's Debian packages: the headers and CMake config files of CLI11,
# nlohmann_json and Eigen under .devdeps/usr (CMAKE_PREFIX_PATH), googletest's sources under
# .devdeps/googletest, RE2's headers and static library (+ re2.pc) under .devdeps/usr, and
# ../shared (the golden fixtures) under .devdeps/shared. .devdeps is ignored by git; name it in
# the device call's `carry` (bench/gpu_run.sh reads it).
#   bash bench/devdeps.sh [SHARED_DIR]      (from the repository root; ~22 MB)
set -euo pipefail
shared=${1:-../shared}
out=.devdeps
rm -rf "$out" && mkdir -p "$out/usr"
for pkg in libcli11-dev nlohmann-json3-dev libeigen3-dev; do
  dpkg -L "$pkg" | while read -r f; do
    case $f in /usr/include/* | /usr/share/cmake/* | /usr/share/eigen3/cmake/* | /usr/lib/cmake/*) ;;
    *) continue ;; esac
    [ -f "$f" ] || continue
    mkdir -p "$out/usr/$(dirname "${f#/usr/}")" && cp "$f" "$out/usr/${f#/usr/}"
  done
done
# RE2 (libre2-dev: model/python_regex.h): headers, the static library only (so the device's
# binaries need no libre2 there) and its pkg-config file pointing into .devdeps/usr.
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
mkdir -p "$out/usr/include/re2" "$out/usr/lib/$arch/pkgconfig"
cp /usr/include/re2/*.h "$out/usr/include/re2/"
cp "/usr/lib/$arch/libre2.a" "$out/usr/lib/$arch/"
sed -e 's|^includedir=.*|includedir=${pcfiledir}/../../../include|' \
  -e 's|^libdir=.*|libdir=${pcfiledir}/..|' "/usr/lib/$arch/pkgconfig/re2.pc" \
  > "$out/usr/lib/$arch/pkgconfig/re2.pc"
cp -r /usr/src/googletest "$out/googletest"
if [ -d "$shared" ]; then cp -r "$shared" "$out/shared"; fi
du -sh "$out"
