#!/usr/bin/env bash
# vLLM 0.33.0's shipped Marlin MoE kernel on moepack's float Marlin output (docs/marlin_float.md,
# bench/gpu_marlin_float.py): every source format moepack converts to a float Marlin layout,
# against an fp32 MoE from the source, corruptions failing. Two steps:
#
#   here (CPU):   bash bench/gpu_marlin_float.sh prepare build/bin/moepack MOE_C_XZ
#                 -> $CARRY (default .fpm/run2/, ignored): moe.so.xz (the wheel's
#                 _moe_C_stable_libtorch.abi3.so, xz'd: the full 38 MB one or the 12.8 MB one
#                 pruned to what an sm90 GPU loads), its checksum, and artifacts/<case>/{src,out,
#                 case.json}: small synth checkpoints converted by moepack
#   device (GPU): bash bench/gpu_marlin_float.sh run     (run's carry: [".fpm/run2"])
#                 -> $OUT/env.txt, marlin_float.{log,json} (moepack's output on the kernel),
#                 plugin_load.{log,json} (bench/gpu_plugin_load.py: the plugin's start-up cost),
#                 and, where $CARRY/fpm holds the fpmarlin scripts (run_marlin_float.py,
#                 vllm_src.py, common.py, vllm/, RECORD), vllm_fixtures.{log,json}: vLLM's own
#                 prepared parameters (tests/golden/marlin_float) on the same kernel
# The first kernel call of each kind JIT-compiles the Marlin PTX on an H100 (no sm_90 SASS in the
# wheel): a few minutes in all, cached under CUDA_CACHE_PATH for the rest of the run.
set -uo pipefail
mode=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
carry=${CARRY:-$repo/.fpm/run2}
# SHA-256 of the decompressed library: vLLM 0.33.0's _moe_C_stable_libtorch.abi3.so as the wheel
# ships it (tests/vllm/moe_c.sha256), or that file stripped and its fatbin pruned to SASS sm_90 +
# all PTX (the 2026-11-25 H100 run's carry).
KNOWN_SHA256="99682a5814b3081de7e4e95cc2c1cf1ba8f6139514ac4c5563dbad16c229a4c0
2faf8de11ee12ad54960a23ae48e3e398649e12d160c8dd9b80314ec5edba380"

case_list() {
  # format family-args layout act target-arch
  cat <<'CASES'
modelopt-mxfp8  --hidden=256:--inter=256  marlin-mxfp8  bf16  sm80
modelopt-mxfp8  --hidden=256:--inter=96   marlin-mxfp8  bf16  sm86
modelopt-mxfp8  --hidden=192:--inter=96   marlin-mxfp8  bf16  sm89
modelopt-mxfp8  --hidden=128:--inter=32   marlin-mxfp8  bf16  sm90
fp8-block       --hidden=256:--inter=256  marlin-fp8    bf16  sm80
fp8-block       --hidden=128:--inter=128  marlin-fp8    fp16  sm86
ct-fp8-block    --hidden=384:--inter=128  marlin-fp8    bf16  sm90
ct-fp8-block    --hidden=256:--inter=256  marlin-fp8    fp16  sm89
modelopt-nvfp4  --hidden=256:--inter=128  marlin-nvfp4  bf16  sm80
modelopt-nvfp4  --hidden=256:--inter=96   marlin-nvfp4  fp16  sm89
ct-nvfp4        --hidden=192:--inter=96   marlin-nvfp4  bf16  sm86
ct-nvfp4        --hidden=256:--inter=128  marlin-nvfp4  bf16  sm90
ct-mxfp4        --hidden=256:--inter=64   marlin-mxfp4  bf16  sm80
ct-mxfp4        --hidden=128:--inter=128  marlin-mxfp4  bf16  sm90
gpt-oss         fixture                   marlin-mxfp4  bf16  sm80
ct-fp8-channel  --hidden=256:--inter=128  marlin-fp8    bf16  sm80
ct-fp8-channel  --hidden=192:--inter=96   marlin-fp8    fp16  sm86
ct-fp8-channel  --hidden=384:--inter=256  marlin-fp8    bf16  sm90
ct-fp8-tensor   --hidden=256:--inter=128  marlin-fp8    bf16  sm86
ct-fp8-tensor   --hidden=128:--inter=160  marlin-fp8    fp16  sm89
modelopt-fp8    --hidden=256:--inter=96   marlin-fp8    bf16  sm80
modelopt-fp8    --hidden=256:--inter=256  marlin-fp8    fp16  sm90
CASES
}

prepare() {
  local bin=$1 xz=$2
  rm -rf "$carry" && mkdir -p "$carry/artifacts"
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$xz" "$carry/moe.so"
  local sum
  sum=$(sha256sum "$carry/moe.so" | cut -d' ' -f1)
  grep -qx "$sum" <<<"$KNOWN_SHA256" || { echo "unknown _moe_C library (sha256 $sum)"; exit 3; }
  echo "$sum  moe.so" >"$carry/moe.sha256"
  rm "$carry/moe.so" && cp "$xz" "$carry/moe.so.xz"
  # CASE_FILTER (an extended regex over the case lines, e.g. ^gpt-oss) prepares some cases only.
  case_list | grep -E "${CASE_FILTER:-.}" | while read -r fmt dims layout act arch; do
    local name=$fmt-${dims//[-=:]/}-$act-$arch
    local d=$carry/artifacts/$name
    mkdir -p "$d"
    if [ "$fmt" = gpt-oss ]; then
      # The tiny gpt-oss in the published format (tests/gpt_oss: E 4, H = I = 64, padded by
      # vLLM's Marlin path to 256 / 128), and the same with every gate/up row pair exchanged
      # (blocks, scales, biases) converted too: the "gate/up swapped" corruption.
      cp -r "$repo/tests/gpt_oss/fixtures/mxfp4" "$d/src" || exit 1
      cp -r "$d/src" "$d/src_swapped" || exit 1
      python3 - "$d/src_swapped/model.safetensors" <<'PY' || exit 1
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
size = {"U8": 1, "BF16": 2, "F16": 2, "F32": 4}
for name, t in json.loads(data[8:8 + n]).items():
    if name == "__metadata__" or ".gate_up_proj_" not in name:
        continue
    b, e = (8 + n + o for o in t["data_offsets"])
    row = size[t["dtype"]]
    for d in t["shape"][2:]:
        row *= d
    for r in range(b, e, 2 * row):  # rows 2j (gate j) and 2j + 1 (up j) exchanged
        data[r:r + row], data[r + row:r + 2 * row] = data[r + row:r + 2 * row], data[r:r + row]
open(path, "wb").write(data)
PY
      "$bin" convert "$d/src_swapped" "$d/out_gate_up_swapped" --backend "$layout" \
        --target-arch "$arch" --threads 1 >/dev/null || exit 1
      rm -rf "$d/src_swapped"
    else
      "$bin" synth "$d/src" --format "$fmt" --family qwen3 --layers 2 --experts 4 --vocab 128 \
        --seed 5 --dtype "$act" ${dims//:/ } --threads 1 >/dev/null || exit 1
    fi
    "$bin" convert "$d/src" "$d/out" --backend "$layout" --target-arch "$arch" --act-dtype "$act" \
      --threads 1 >/dev/null || exit 1
    "$bin" verify "$d/out" --source "$d/src" --tokens 16 >/dev/null || { echo "$name: verify failed"; exit 1; }
    # Only the experts travel (the rest of the checkpoint is copied through, untouched).
    for f in "$d"/{src,out,out_gate_up_swapped}/model.safetensors; do
      [ -f "$f" ] || continue
      python3 - "$f" <<'PY' || exit 1
import json, struct, sys
path = sys.argv[1]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
keep, body = {}, bytearray()
for name, t in header.items():
    if name == "__metadata__" or ".mlp.experts." not in name:
        continue
    b, e = t["data_offsets"]
    keep[name] = dict(t, data_offsets=[len(body), len(body) + e - b])
    body += data[8 + n + b:8 + n + e]
h = json.dumps(keep, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + body)
PY
    done
    printf '{"format": "%s", "layout": "%s", "act": "%s", "target_arch": "%s"}\n' \
      "$fmt" "$layout" "$act" "$arch" >"$d/case.json"
  done
  # vLLM's own prepared parameters on the kernel too (the fpmarlin scripts, FPM=/work/main/.fpm)
  if [ -n "${FPM:-}" ]; then
    mkdir -p "$carry/fpm"
    cp -r "$FPM"/{run_marlin_float.py,vllm_src.py,common.py,vllm,RECORD} "$carry/fpm/" || exit 1
  fi
  du -sh "$carry" "$carry"/artifacts
}

run() {
  local out=${OUT:-/tmp/out} w=/tmp/marlin_float
  mkdir -p "$out" "$w"
  export CUDA_MODULE_LOADING=LAZY CUDA_CACHE_MAXSIZE=4294967296 PYTHONUNBUFFERED=1
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))'
  } >"$out/env.txt" 2>&1
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$carry/moe.so.xz" "$w/moe.so"
  (cd "$w" && sha256sum -c "$carry/moe.sha256") >>"$out/env.txt" 2>&1 || { cat "$out/env.txt"; exit 3; }
  cat "$out/env.txt"
  python3 "$here/gpu_marlin_float.py" --so "$w/moe.so" "$carry/artifacts" \
    --json "$out/marlin_float.json" 2>&1 | tee "$out/marlin_float.log"
  local rc=${PIPESTATUS[0]}
  python3 "$here/gpu_plugin_load.py" --json "$out/plugin_load.json" 2>&1 | tee "$out/plugin_load.log"
  if [ -f "$carry/fpm/run_marlin_float.py" ]; then
    VLLM_SRC=$carry/fpm/vllm VLLM_RECORD=$carry/fpm/RECORD timeout "${FIXTURE_TIMEOUT:-240}" \
      python3 "$carry/fpm/run_marlin_float.py" --so "$w/moe.so" "$repo/tests/golden/marlin_float" \
      --json "$out/vllm_fixtures.json" 2>&1 | tee "$out/vllm_fixtures.log"
  fi
  return "$rc"
}

case $mode in
  prepare) prepare "${2:?moepack binary}" "${3:?_moe_C .so.xz}" ;;
  run) run ;;
  *) echo "usage: $0 prepare MOEPACK_BIN MOE_C_XZ | run"; exit 2 ;;
esac
