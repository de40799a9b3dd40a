#!/usr/bin/env bash
# triton-mxfp4 on the H100 (docs/triton_mxfp4.md, bench/gpu_triton_mxfp4.py): vLLM 0.33.0's own
# Triton MXFP4 conversion of gpt-oss run on the GPU against moepack's bytes and the committed CPU
# fixtures, and matmul_ogs (the OAI Triton kernel vLLM runs on Hopper) on moepack's output against
# an fp32 reference, with mutants that must fail. Two steps:
#
#   here (CPU):   bash bench/gpu_triton_mxfp4.sh prepare build/bin/moepack
#                 -> $CARRY (default .tmx/, ignored, ~3 MB): triton_kernels/ (vLLM 0.33.0's vendored
#                 copy from the test venv), vllm_src/ (its fused_moe/oracle/mxfp4.py,
#                 quantization/utils/mxfp4_utils.py and fused_moe/experts/
#                 gpt_oss_triton_kernels_moe.py), cases/<name>/{src,out}: gpt-oss checkpoints
#                 (tests/gpt_oss/fixtures/mxfp4_e2_h192_i96 and bench/gpt_oss_checkpoint.py shapes) and moepack's
#                 `convert --target-arch sm90` of each (triton-mxfp4); then a CPU self-test of the
#                 byte comparisons (vLLM's code with the capability faked as sm90)
#   device (GPU): bash bench/gpu_triton_mxfp4.sh run     (carry: [".tmx"])
#                 -> $OUT/triton_mxfp4.{log,json}, env.txt; exit 0 when every byte matches, the
#                 kernel's norm error is < 2e-2 on every layer and both mutants exceed it, and the
#                 plugin's wrapping (integrations/vllm/moepack_vllm/triton_mxfp4.py, no vLLM) gives
#                 vLLM's objects, on which matmul_ogs and vLLM's triton_kernel_moe_forward match
#                 fp32 (< 2e-2) and the biases-dropped / gate-up-exchanged mutants do not
set -uo pipefail
mode=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
carry=${CARRY:-$repo/.tmx}
VENV=${VENV:-$HOME/.cache/moepack/venv-vllm-0.33.0}

# name  experts hidden inter layers (fixture: tests/gpt_oss/fixtures/mxfp4_e2_h192_i96); shapes
# matmul_ogs runs on Hopper (triton-mxfp4 refuses the others: docs/triton_mxfp4.md)
case_list() {
  cat <<'CASES'
fixture       -  -     -    -
e2_h2880_i160 2  2880  160  1
e4_h512_i256  4  512   256  2
e3_h320_i224  3  320   224  1
CASES
}

prepare() {
  local bin=$1
  local site
  site=$("$VENV/bin/python" -c "import vllm, os; print(os.path.dirname(vllm.__file__))") || exit 1
  rm -rf "$carry" && mkdir -p "$carry/vllm_src" "$carry/cases"
  cp -r "$site/third_party/triton_kernels" "$carry/" && find "$carry" -name __pycache__ -prune -exec rm -rf {} +
  cp "$site/model_executor/layers/fused_moe/oracle/mxfp4.py" "$carry/vllm_src/oracle_mxfp4.py"
  cp "$site/model_executor/layers/quantization/utils/mxfp4_utils.py" "$carry/vllm_src/mxfp4_utils.py"
  cp "$site/model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py" \
    "$carry/vllm_src/gpt_oss_triton_kernels_moe.py"
  while read -r name e h i l; do
    local d=$carry/cases/$name
    mkdir -p "$d"
    if [ "$name" = fixture ]; then
      cp -r "$repo/tests/gpt_oss/fixtures/mxfp4_e2_h192_i96" "$d/src" || exit 1
    else
      "$VENV/bin/python" "$repo/bench/gpt_oss_checkpoint.py" "$d/src" --experts "$e" --hidden "$h" \
        --inter "$i" --layers "$l" --seed "$h" --vocab 16 || exit 1
    fi
    "$bin" convert "$d/src" "$d/out" --target-arch sm90 --backend triton-mxfp4 >"$d/convert.txt" 2>&1 ||
      { cat "$d/convert.txt"; exit 1; }
    "$bin" verify "$d/out" --source "$d/src" >"$d/verify.txt" 2>&1 || { cat "$d/verify.txt"; exit 1; }
  done < <(case_list)
  "$bin" --version >"$carry/moepack_version.txt" 2>&1
  git -C "$repo" rev-parse HEAD >>"$carry/moepack_version.txt"
  "$VENV/bin/python" "$here/gpu_triton_mxfp4.py" --carry "$carry" --fixtures "$repo/tests/golden/triton_mxfp4" \
    --out "$carry/cpu_selftest.json" --cpu-selftest >"$carry/cpu_selftest.log" 2>&1 ||
    { tail -30 "$carry/cpu_selftest.log"; exit 1; }
  tail -1 "$carry/cpu_selftest.log"
  du -sh "$carry"
}

run() {
  OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    cat "$carry/moepack_version.txt"; } >"$OUT/env.txt" 2>&1
  python3 "$here/gpu_triton_mxfp4.py" --carry "$carry" --fixtures "$repo/tests/golden/triton_mxfp4" \
    --out "$OUT/triton_mxfp4.json" >"$OUT/triton_mxfp4.log" 2>&1
  local rc=$?
  tail -20 "$OUT/triton_mxfp4.log"
  return $rc
}

case "$mode" in
  prepare) prepare "${2:?moepack binary}" ;;
  run) run ;;
  *) echo "usage: $0 prepare MOEPACK_BIN | run" >&2; exit 2 ;;
esac
