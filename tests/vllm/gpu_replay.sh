#!/usr/bin/env bash
# The plugin's serving calls on vLLM 0.33.0's shipped Marlin kernel (tests/vllm/gpu_replay.py says
# why a record, not vLLM itself, travels to the device). Two steps:
#
#   here (CPU):  bash tests/vllm/gpu_replay.sh prepare MOEPACK_BIN MOE_C_XZ [CARRY]
#                records every float Marlin case of test_serving_replay.py in the real vLLM 0.33.0
#                (the test venv) under CARRY/records and copies the xz'd _moe_C library beside them
#                (CARRY defaults to .replay/, an ignored folder: `echo /.replay/ >>.git/info/exclude`)
#   device:      bash tests/vllm/gpu_replay.sh run [CARRY]      (carry: [".replay"])
#                -> $OUT/replay.log, $OUT/replay.json
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# The wheel's _moe_C_stable_libtorch.abi3.so (tests/vllm/moe_c.sha256), or that file stripped
# with its fatbin pruned to SASS sm_90 + all PTX (bench/gpu_marlin_float.sh).
KNOWN_SHA256="99682a5814b3081de7e4e95cc2c1cf1ba8f6139514ac4c5563dbad16c229a4c0
2faf8de11ee12ad54960a23ae48e3e398649e12d160c8dd9b80314ec5edba380"
mode=${1:-}
case $mode in
  prepare)
    bin=$(realpath "$2") xz=$(realpath "$3") carry=${4:-$root/.replay}
    venv=${MOEPACK_VLLM_VENV:-$HOME/.cache/moepack/venv-vllm-0.33.0}
    rm -rf "$carry" && mkdir -p "$carry"
    (cd "$here" && PYTHONPATH="$root/integrations/vllm" MOEPACK_BIN=$bin \
       MOEPACK_REPLAY_OUT="$carry/records" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
       -W ignore::DeprecationWarning test_serving_replay.py)
    cp "$xz" "$carry/moe.so.xz"
    du -sh "$carry"
    ;;
  run)
    carry=$(realpath "${2:-$root/.replay}")
    OUT=${OUT:-/tmp/replay-out}
    mkdir -p "$OUT"
    export CUDA_CACHE_MAXSIZE=4294967296 PYTHONUNBUFFERED=1  # the Marlin PTX JIT, once per kind
    so=$(mktemp -d)/moe.so
    python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('$carry/moe.so.xz'), open('$so', 'wb'))"
    sum=$(sha256sum "$so" | cut -d' ' -f1)
    grep -qx "$sum" <<<"$KNOWN_SHA256" || { echo "unknown _moe_C library: $sum"; exit 3; }
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
      echo "_moe_C sha256 $sum"
      PYTHONUNBUFFERED=1 python3 "$here/gpu_replay.py" "$so" "$carry/records" --json "$OUT/replay.json"
    } 2>&1 | tee "$OUT/replay.log"
    ;;
  *) echo "usage: $0 prepare MOEPACK_BIN MOE_C_XZ [CARRY] | run [CARRY]"; exit 2 ;;
esac
