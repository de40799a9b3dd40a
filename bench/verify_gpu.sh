#!/usr/bin/env bash
# Whole-model `verify --device cuda` against reading the files (issue 12: <= 1.5x `cat`), in one
# run. Expected invocation, one device call from the repository root (build-gpu built as in
# bench/gpu_run.sh; logs and numbers under $OUT):
#
#   OUT=$OUT bash bench/verify_gpu.sh build-gpu/bin/moepack /tmp/verify-bench
#
# Synthesises a Qwen3-30B-A3B-shaped GPTQ int4 g128 checkpoint of 28 MoE layers (E=128, H=2048,
# I=768: 8.5 GB of expert tensors), converts it to Marlin, then with a warm page cache (the
# files are read once first) times `cat` of the converted shards and `verify --device cuda`
# (without --source: integrity + the layout's MoE against its decoding, as the CPU path) and
# prints the ratio. LAYERS=N overrides the layer count; SOURCE=1 also times verify --source.
set -euo pipefail
M=${1:-build-gpu/bin/moepack}
work=${2:-/tmp/verify-bench}
OUT=${OUT:-$work/out}
LAYERS=${LAYERS:-29}
mkdir -p "$work" "$OUT"
src=$work/src dst=$work/dst
if [ ! -d "$dst" ]; then
  rm -rf "$src"
  "$M" synth "$src" --format gptq --family qwen3 --layers "$LAYERS" --experts 128 --hidden 2048 \
    --inter 768 --top-k 8 --vocab 32000 --seed 1 --max-shard-size 4GB > "$OUT/synth.txt"
  t0=$(date +%s.%N)
  "$M" convert "$src" "$dst" --target-arch sm90 > "$OUT/convert.txt"
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "convert: %.2f s\n", b - a }' | tee -a "$OUT/verify_gpu.txt"
fi
du -sb "$dst" | awk '{printf "converted: %.2f GB\n", $1/1e9}' | tee -a "$OUT/verify_gpu.txt"
cat "$dst"/*.safetensors > /dev/null  # warm the page cache for both
t0=$(date +%s.%N)
cat "$dst"/*.safetensors > /dev/null
t1=$(date +%s.%N)
rc=0
"$M" verify "$dst" --device cuda --json > "$OUT/verify_gpu.json" || rc=$?
t2=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v c="$t2" -v rc="$rc" 'BEGIN {
  printf "cat:                 %.2f s\nverify --device cuda: %.2f s (exit %d)\nratio verify / cat = %.2f\n",
         b - a, c - b, rc, (c - b) / (b - a) }' | tee -a "$OUT/verify_gpu.txt"
python3 -c "import json,sys; r=json.load(open('$OUT/verify_gpu.json')); print('passed', r['passed'], 'layers', len(r['layers']), 'worst norm_err', max(l['norm_err'] for l in r['layers']))" | tee -a "$OUT/verify_gpu.txt"
/usr/bin/time -v "$M" verify "$dst" --device cuda > /dev/null 2> "$OUT/verify_gpu_time.txt" || true
grep -E "Maximum resident|Elapsed" "$OUT/verify_gpu_time.txt" | tee -a "$OUT/verify_gpu.txt" || true
if [ "${SOURCE:-0}" = 1 ]; then
  t0=$(date +%s.%N)
  "$M" verify "$dst" --source "$src" --device cuda > /dev/null
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "verify --source --device cuda: %.2f s\n", b - a }' | tee -a "$OUT/verify_gpu.txt"
fi
