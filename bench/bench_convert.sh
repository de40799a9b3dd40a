#!/usr/bin/env bash
# Conversion throughput of a >= 1 GiB synthetic GPTQ checkpoint against `cp -r` of the same
# directory, as a ratio from one run (both with a warm page cache: the source is read once first).
#
#   bench/bench_convert.sh [WORKDIR] [extra synth flags]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
M=${MOEPACK:-$here/build/bin/moepack}
work=${1:-/tmp/moepack-bench}
shift || true
mkdir -p "$work"
src=$work/src
if [ ! -d "$src" ]; then
  # 8 MoE layers x 64 experts x (H=2048, I=768) int4 g128 ~ 1.2 GB of tensors
  "$M" synth "$src" --format gptq --family qwen3 --layers 9 --experts 64 --hidden 2048 --inter 768 \
    --vocab 32000 --seed 1 --max-shard-size 2GB "$@"
fi
du -sb "$src" | awk '{printf "source: %.2f GiB\n", $1/1073741824}'
cat "$src"/*.safetensors > /dev/null  # warm the page cache for both runs
rm -rf "$work/cp" "$work/out"
t0=$(date +%s.%N); cp -r "$src" "$work/cp"; sync; t1=$(date +%s.%N)
"$M" convert "$src" "$work/out" --backend marlin --target-arch sm90; sync; t2=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN {
  cp = b - a; cv = c - b;
  printf "cp -r:   %.2f s\nconvert: %.2f s\nratio convert / cp = %.2f\n", cp, cv, cv / cp }'
/usr/bin/time -v "$M" convert "$src" "$work/out2" --backend marlin --target-arch sm90 --force 2>&1 \
  | grep -E "Maximum resident|Elapsed" || true
rm -rf "$work/cp" "$work/out2"
