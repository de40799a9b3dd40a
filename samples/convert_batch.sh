#!/usr/bin/env bash
# Batch conversion for CI artifact pipelines: convert every checkpoint under IN_ROOT into
# OUT_ROOT/<name>, verify each against its source, and print one JSON line per checkpoint.
# Exit status: 0 if all converted and verified, else the first failing moepack exit code.
#
#   samples/convert_batch.sh IN_ROOT OUT_ROOT [extra convert flags, e.g. --target-arch sm100]
#
# moepack's exit codes: 0 ok, 1 verification failed, 2 usage, 3 invalid input,
# 4 unsupported (no backend / shape constraint), 5 I/O.
set -u
MOEPACK=${MOEPACK:-$(dirname "$0")/../build/bin/moepack}
in_root=${1:?usage: convert_batch.sh IN_ROOT OUT_ROOT [convert flags]}
out_root=${2:?usage: convert_batch.sh IN_ROOT OUT_ROOT [convert flags]}
shift 2
mkdir -p "$out_root"
status=0
for src in "$in_root"/*/; do
  src=${src%/}
  [ -f "$src/config.json" ] || continue
  name=$(basename "$src")
  dst="$out_root/$name"
  "$MOEPACK" convert "$src" "$dst" --force --json "$@" >"$out_root/$name.convert.json"
  rc=$?
  if [ $rc -eq 0 ]; then
    "$MOEPACK" verify "$dst" --source "$src" --json --report "$out_root/$name.verify.html" \
      >"$out_root/$name.verify.json"
    rc=$?
  fi
  echo "{\"checkpoint\": \"$name\", \"exit_code\": $rc}"
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
done
exit $status
