#!/usr/bin/env bash
# gpt-oss post-processing on the GPU at gpt-oss-120b's shape (bench/gpt_oss_postprocess_gpu.py):
# vLLM 0.33.0's own TRITON and MARLIN MXFP4 MoE post-processing against the moepack-vllm plugin's,
# per layer and for the model (time, peak GPU memory above the loaded weights). Two steps:
#
#   here (CPU):   bash bench/gpt_oss_postprocess_gpu.sh prepare C_SO_XZ
#                 -> $CARRY (default .gob/, ignored): triton_kernels/ (vLLM 0.33.0's vendored copy
#                 from the test venv), vllm_src/ (its fused_moe/oracle/mxfp4.py,
#                 quantization/utils/{mxfp4_utils,marlin_utils,marlin_utils_fp4}.py, _custom_ops.py),
#                 C.so.xz (C_SO_XZ: the wheel's _C_stable_libtorch.abi3.so, xz'd, as the
#                 coordinator keeps it in .fpm/C.sm90.so.xz; its SHA-256 is checked on the device)
#                 and a CPU self-test of the script on small shapes (measures nothing)
#                 With MOEPACK (a moepack binary built here, Release), also bin/: the binary and the
#                 libre2 it links, for `all` (the device machine builds nothing then).
#   device (GPU): bash bench/gpt_oss_postprocess_gpu.sh run [LAYERS [E H I]]   (carry: [".gob"])
#                 -> $OUT/postprocess.{log,json}, env.txt; default 36 layers x 128 x 2880 x 2880
#                 bash bench/gpt_oss_postprocess_gpu.sh all FULL_LAYERS
#                 -> run (36 layers), then bench/gpt_oss_fullshape.sh with the carried binary on
#                 FULL_LAYERS layers of gpt-oss-120b's expert shape ($OUT/fullshape.md); all of
#                 $OUT also as $OUT/gob.tgz
set -uo pipefail
mode=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
carry=${CARRY:-$repo/.gob}
VENV=${VENV:-$HOME/.cache/moepack/venv-vllm-0.33.0}
# The decompressed library: vLLM 0.33.0's _C_stable_libtorch.abi3.so pruned to sm_90 (the
# coordinator's .fpm/C.sm90.so.xz, the library every earlier Marlin device run used).
KNOWN_SHA256=2aa30021d1eb04128ef87169920caa6307f3fc0fb52d3a0b235702c83793695b

prepare() {
  local so_xz=$1 site
  site=$("$VENV/bin/python" -c "import vllm, os; print(os.path.dirname(vllm.__file__))") || exit 1
  rm -rf "$carry" && mkdir -p "$carry/vllm_src"
  cp -r "$site/third_party/triton_kernels" "$carry/" &&
    find "$carry" -name __pycache__ -prune -exec rm -rf {} +
  cp "$site/model_executor/layers/fused_moe/oracle/mxfp4.py" "$carry/vllm_src/oracle_mxfp4.py"
  local u=$site/model_executor/layers/quantization/utils
  cp "$u/mxfp4_utils.py" "$u/marlin_utils.py" "$u/marlin_utils_fp4.py" "$site/_custom_ops.py" \
    "$carry/vllm_src/"
  cp "$so_xz" "$carry/C.so.xz" || exit 1
  if [ -n "${MOEPACK:-}" ]; then
    mkdir -p "$carry/bin"
    cp "$MOEPACK" "$carry/bin/moepack" || exit 1
    # The shared libraries it links beyond glibc / libstdc++ / libgcc (re2).
    ldd "$MOEPACK" | awk '/=> \// { print $3 }' | grep -v -E 'lib(c|m|stdc\+\+|gcc_s)\.so' |
      while read -r lib; do cp -L "$lib" "$carry/bin/"; done
    xz -T0 -f "$carry/bin/moepack"
  fi
  "$VENV/bin/python" "$here/gpt_oss_postprocess_gpu.py" --carry "$carry" --cpu-selftest \
    --layers 2 --E 2 --H 256 --I 192 >"$carry/cpu_selftest.log" 2>&1 ||
    { tail -30 "$carry/cpu_selftest.log"; exit 1; }
  tail -6 "$carry/cpu_selftest.log"
  du -sh "$carry"
}

run() {
  OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    git -C "$repo" rev-parse HEAD 2>/dev/null; } >"$OUT/env.txt" 2>&1
  local so=/tmp/gob_C.so
  xz -dc "$carry/C.so.xz" >"$so" || { echo "could not decompress $carry/C.so.xz"; return 1; }
  local sum
  sum=$(sha256sum "$so" | cut -d' ' -f1)
  [ "$sum" = "$KNOWN_SHA256" ] || { echo "C.so SHA-256 $sum is not vLLM 0.33.0's ($KNOWN_SHA256)"; return 1; }
  # Expandable segments: the model's ~60 GiB of loaded experts and their outputs, freed and
  # allocated layer by layer, without the allocator's fragmentation deciding the peak.
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    python3 "$here/gpt_oss_postprocess_gpu.py" --carry "$carry" --so "$so" --layers "${1:-36}" \
    --E "${2:-128}" --H "${3:-2880}" --I "${4:-2880}" --json "$OUT/postprocess.json" \
    >"$OUT/postprocess.log" 2>&1
  local rc=$?
  tail -8 "$OUT/postprocess.log"
  return $rc
}

all() {
  OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  run 36 2>&1 | tee "$OUT/run.txt"
  local bin=/tmp/gob-bin
  mkdir -p "$bin" && cp "$carry"/bin/* "$bin/" && xz -df "$bin/moepack.xz" && chmod +x "$bin/moepack"
  LD_LIBRARY_PATH=$bin BUDGET_S=${BUDGET_S:-240} bash "$here/gpt_oss_fullshape.sh" "$bin/moepack" "${1:-4}" /tmp/gpt-oss-full \
    2>&1 | tee "$OUT/fullshape.md"
  (cd "$OUT" && tar czf /tmp/gob.tgz . && mv /tmp/gob.tgz "$OUT/gob.tgz")
}

case "$mode" in
  prepare) prepare "${2:?C_SO_XZ: the vLLM wheel _C_stable_libtorch.abi3.so, xz}" ;;
  run) shift; run "$@" ;;
  all) shift; all "$@" ;;
  *) echo "usage: $0 prepare C_SO_XZ | run [LAYERS [E H I]] | all [FULL_LAYERS]" >&2; exit 2 ;;
esac
