#!/usr/bin/env bash
# Peak anonymous memory (RssAnon, sampled every 10 ms from /proc) and VmHWM of `moepack verify`
# against `moepack convert` on one synth checkpoint with big layers.
#   bench/verify_memory.sh [MOEPACK] [WORKDIR] [synth flags...]
# Default checkpoint: --format gptq --experts 64 --hidden 2048 --inter 768 --layers 2 (one MoE
# layer of 151 MB packed, 302 MB of canonical codes).
set -euo pipefail
BIN=${1:-build/bin/moepack}
WORK=${2:-/tmp/moepack-verify-memory}
shift $(( $# > 2 ? 2 : $# ))
SYNTH=("$@")
[ ${#SYNTH[@]} -eq 0 ] && SYNTH=(--format gptq --experts 64 --hidden 2048 --inter 768 --layers 2)
mkdir -p "$WORK"
[ -d "$WORK/src" ] || "$BIN" synth "$WORK/src" "${SYNTH[@]}" >/dev/null

# Runs "$@" and prints "peak_rss_anon_kib vm_hwm_kib seconds".
measure() {
  local start end pid peak=0 hwm=0 v
  start=$(date +%s.%N)
  "$@" >/dev/null 2>&1 &
  pid=$!
  while [ -r /proc/$pid/status ]; do
    v=$(awk '/^RssAnon:/ {a=$2} /^VmHWM:/ {h=$2} END {print a+0, h+0}' /proc/$pid/status 2>/dev/null || echo "0 0")
    set -- $v
    [ "${1:-0}" -gt "$peak" ] && peak=$1
    [ "${2:-0}" -gt "$hwm" ] && hwm=$2
    sleep 0.01
  done
  wait $pid || { echo "failed: $*" >&2; return 1; }
  end=$(date +%s.%N)
  echo "$peak $hwm $(echo "$end - $start" | bc)"
}

rm -rf "$WORK/dst"
echo "convert            $(measure "$BIN" convert "$WORK/src" "$WORK/dst" --threads 2)"
echo "verify --source    $(measure "$BIN" verify "$WORK/dst" --source "$WORK/src" --threads 2)"
echo "verify             $(measure "$BIN" verify "$WORK/dst" --threads 2)"
for c in 256MiB 64MiB; do
  echo "convert    --chunk-size $c $(rm -rf "$WORK/dst2"; measure "$BIN" convert "$WORK/src" "$WORK/dst2" --threads 2 --chunk-size $c)"
  if "$BIN" verify --help | grep -q -- --chunk-size; then
    echo "verify --source --chunk-size $c $(measure "$BIN" verify "$WORK/dst" --source "$WORK/src" --threads 2 --chunk-size $c)"
  fi
done
