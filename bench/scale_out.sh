#!/usr/bin/env bash
# Shard-parallel conversion against one convert on the same machine: an n = N split run by the
# GNU parallel recipe (JOBS tasks at a time, --threads 1 each) plus merge, against a single
# `convert --threads JOBS`. Both read a warm page cache; the merged output must equal the single
# convert's bytes (checked with diff -r).
#
#   bench/scale_out.sh [WORKDIR] [N] [JOBS] [extra synth flags]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
M=${MOEPACK:-$here/build/bin/moepack}
work=${1:-/tmp/moepack-bench-scale-out}
n=${2:-4}
jobs=${3:-2}
shift 3 || shift $#
mkdir -p "$work"
src=$work/src
if [ ! -d "$src" ]; then
  # 8 MoE layers x 32 experts x (H=2048, I=768) int4 g128 ~ 0.6 GB of tensors
  "$M" synth "$src" --format gptq --family qwen3 --layers 9 --experts 32 --hidden 2048 \
    --inter 768 --vocab 32000 --seed 1 --max-shard-size 2GB "$@" >/dev/null
fi
du -sb "$src" | awk '{printf "source: %.2f GiB\n", $1/1073741824}'
cat "$src"/*.safetensors >/dev/null
rm -rf "$work/one" "$work/split" "$work/split.parts"
now() { date +%s.%N; }
t0=$(now)
"$M" convert "$src" "$work/one" --threads "$jobs" >/dev/null
sync
t1=$(now)
seq 0 $((n - 1)) | parallel -j "$jobs" "$M" convert "$src" "$work/split" --shard {}/"$n" \
  --threads 1 >/dev/null
sync
t2=$(now)
"$M" merge "$work/split" --source "$src" --threads "$jobs" >/dev/null
sync
t3=$(now)
diff -r "$work/one" "$work/split"
"$M" convert "$src" "$work/split" --shard 0/"$n" --dry-run --json |
  python3 -c 'import json,sys; u=json.load(sys.stdin)["units"]; print("unit bytes:", [x["tensor_bytes"] for x in u])'
awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v n="$n" -v j="$jobs" 'BEGIN {
  one = b - a; parts = c - b; merge = d - c;
  printf "one convert (--threads %d):            %.2f s\n", j, one
  printf "n=%d parts (GNU parallel -j %d, 1 thread): %.2f s\n", n, j, parts
  printf "merge:                                  %.2f s\n", merge
  printf "parts + merge / one convert = %.2f\n", (parts + merge) / one }'
echo "merged output byte-identical to the single convert"
rm -rf "$work/one" "$work/split" "$work/split.parts"
