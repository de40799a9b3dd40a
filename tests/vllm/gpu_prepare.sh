#!/usr/bin/env bash
# Prepares what the GPU kernel test carries to a device machine (no package registry there):
#   tests/vllm/gpu_prepare.sh MOEPACK_BIN VLLM_SITE_PACKAGES OUT
# OUT/_moe_C_stable_libtorch.abi3.so.gz (from the installed vllm 0.33.0 wheel, checksum checked
# against moe_c.sha256) and OUT/artifacts/<case>/{src,out,case.json}: tiny synth checkpoints
# converted by MOEPACK_BIN. Then on the device: tests/vllm/gpu_run.sh OUT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1 site=$2 out=$3
so=$site/vllm/_moe_C_stable_libtorch.abi3.so
(cd "$(dirname "$so")" && sha256sum -c "$here/moe_c.sha256")
mkdir -p "$out/artifacts"
gzip -9 -c "$so" >"$out/_moe_C_stable_libtorch.abi3.so.gz"
for c in "gptq qwen3 gptq 4" "awq qwen3 awq 4" "ct-w4a16 mixtral ct 4" "ct-w8a16 qwen3 ct 8"; do
  set -- $c
  d=$out/artifacts/$1-$2
  rm -rf "$d" && mkdir -p "$d"
  "$bin" synth "$d/src" --format "$1" --family "$2" --layers 2 --experts 8 --hidden 256 \
    --inter 128 --vocab 128 --threads 1 >/dev/null
  # Marlin named: gpu_marlin_kernel.py runs the Marlin kernel (sm90 + 0.33 defaults to Humming)
  "$bin" convert "$d/src" "$d/out" --backend marlin --threads 1 >/dev/null
  printf '{"decode": "%s", "bits": %s, "family": "%s"}\n' "$3" "$4" "$2" >"$d/case.json"
done
