#!/usr/bin/env bash
# The GNU parallel recipe for real: `moepack-scale-out.sh parallel` (4 units, 2 at a time, then
# merge) on a synthesised checkpoint must give the bytes of a single convert; a second run skips
# every part. Exit 77 (skipped) without GNU parallel (Debian: apt-get install parallel).
#
#   parallel_recipe.sh MOEPACK_BIN SOURCE_DIR
set -euo pipefail
bin=$(realpath "$1")
repo=$(realpath "$2")
if ! parallel --version 2>/dev/null | grep -q 'GNU parallel'; then
  echo "SKIP: GNU parallel not found (moreutils' parallel is another program)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/moepack-parallel.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$bin" synth "$work/src" --format awq --family mixtral --layers 3 --experts 4 --hidden 256 \
  --inter 256 --seed 5 >/dev/null
flags=(--max-shard-size 300KB --threads 1)
"$bin" convert "$work/src" "$work/ref" "${flags[@]}" >/dev/null
recipe=$repo/samples/scale_out/moepack-scale-out.sh
MOEPACK=$bin "$recipe" parallel "$work/src" "$work/dst" 4 -j 2 -- "${flags[@]}"
diff -r "$work/ref" "$work/dst"
rm -rf "$work/dst"
out=$(MOEPACK=$bin "$recipe" parallel "$work/src" "$work/dst" 4 -j 2 -- "${flags[@]}")
echo "$out"
[ "$(grep -c 'already complete' <<<"$out")" = 4 ] || { echo "FAIL: parts were not skipped"; exit 1; }
diff -r "$work/ref" "$work/dst"
# A failing task stops the recipe with moepack's exit code and no merge (3/4 is not a unit of 4).
rm -rf "$work/dst" "$work/dst.parts"
set +e
MOEPACK=$bin "$recipe" parallel "$work/src" "$work/dst" 4 -j 2 -- "${flags[@]}" --backend nosuch
rc=$?
set -e
[ "$rc" = 2 ] || { echo "FAIL: a failed task gave exit $rc, not moepack's 2"; exit 1; }
[ ! -e "$work/dst" ] || { echo "FAIL: merged despite a failed task"; exit 1; }
echo "PASS: GNU parallel recipe"
