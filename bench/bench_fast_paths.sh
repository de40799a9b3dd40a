#!/usr/bin/env bash
# Direct fast paths against the canonical path and `cp -r`, per pair: one synthetic checkpoint
# each (GPTQ int4, compressed-tensors W4A16, AWQ -> Marlin; ModelOpt MXFP8 -> TRT-LLM MXFP8),
# converted with and without --no-fast-path (warm page cache, one run each), the outputs compared
# by SHA-256.
#
#   bench/bench_fast_paths.sh [WORKDIR] [LAYERS]   (env THREADS: --threads, default 0 = all)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
M=${MOEPACK:-$here/build/bin/moepack}
work=${1:-/tmp/moepack-fast-bench}
layers=${2:-5}
threads=${THREADS:-0}
mkdir -p "$work"
now() { date +%s.%N; }
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), threads $threads"
printf "%-16s %9s %8s %10s %10s %10s %10s %8s\n" pair "MiB" "cp s" "direct s" "canon s" \
  "direct MB/s" "canon MB/s" "same"
for pair in gptq:marlin:sm90 ct-w4a16:marlin:sm90 awq:marlin:sm90 modelopt-mxfp8:trtllm-mxfp8:sm100; do
  IFS=: read -r format backend arch <<<"$pair"
  src=$work/src-$format
  if [ ! -d "$src" ]; then
    # (layers - 1) MoE layers x 64 experts x (H=2048, I=768), as bench_convert.sh
    "$M" synth "$src" --format "$format" --family qwen3 --layers "$layers" --experts 64 \
      --hidden 2048 --inter 768 --vocab 32000 --seed 1 --max-shard-size 2GB >/dev/null
  fi
  bytes=$(du -sb "$src" | cut -f1)
  cat "$src"/*.safetensors >/dev/null
  rm -rf "$work/cp" "$work/fast" "$work/canon"
  t0=$(now); cp -r "$src" "$work/cp"; sync; t1=$(now)
  "$M" convert "$src" "$work/fast" --backend "$backend" --target-arch "$arch" \
    --threads "$threads" >/dev/null; sync; t2=$(now)
  "$M" convert "$src" "$work/canon" --backend "$backend" --target-arch "$arch" \
    --threads "$threads" --no-fast-path >/dev/null; sync; t3=$(now)
  same=yes
  (cd "$work/fast" && sha256sum $(ls)) >"$work/fast.sha"
  (cd "$work/canon" && sha256sum $(ls)) >"$work/canon.sha"
  cmp -s "$work/fast.sha" "$work/canon.sha" || same=NO
  awk -v p="$format->$backend" -v b="$bytes" -v a="$t0" -v c="$t1" -v d="$t2" -v e="$t3" \
    -v s="$same" 'BEGIN { cp = c - a; f = d - c; k = e - d; mb = b / 1e6;
      printf "%-16s %9.0f %8.2f %10.2f %10.2f %10.0f %10.0f %8s\n", p, b / 1048576, cp, f, k,
        mb / f, mb / k, s }'
  rm -rf "$work/cp" "$work/fast" "$work/canon"
done
