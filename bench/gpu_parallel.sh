#!/usr/bin/env bash
# Tensor- and expert-parallel artifacts on vLLM 0.33.0's shipped Marlin MoE kernel (issue 25
# item 3; tests/vllm/gpu_parallel_kernel.py): every rank's tensors through moe_wna16_marlin_gemm,
# TP partial outputs summed (the all-reduce), EP tokens routed to the owners' local experts,
# against the fp32 MoE of the unsharded source. Two steps:
#
#   here (CPU):   bash bench/gpu_parallel.sh prepare build/bin/moepack MOE_SO_XZ
#                 -> $CARRY (default .tpep2/, ignored): moe.so.xz (vLLM 0.33.0's
#                 _moe_C_stable_libtorch.abi3.so, xz'd: the 38 MB wheel file or the 12.8 MB one
#                 pruned to what an sm90 GPU loads; see bench/gpu_marlin_float.sh), its checksum,
#                 and cases/<case>/{case.json,out} + cases/_src-*: small synth checkpoints converted
#                 by moepack at TP 1/2/4/8 and EP 2/3/4 (linear, round_robin), each verified here
#   device (GPU): bash bench/gpu_parallel.sh run            (the run's carry: [".tpep2"])
#                 -> $OUT/env.txt, parallel.{log,json}; exit 0 when every case holds
#
# Cases: Marlin int4 (GPTQ, AWQ) at TP 2/4/8 and EP 2/3/4, including group 128 with I/tp = 128
# written twice, with the kernel's w13 scale permutation (must pass) and with vLLM 0.33's own
# loader permutation (--vllm-w13-scale-size-k: size_k = I/tp, the channelwise permutation; must
# fail; H = 256 so that the right size_k, H, differs from I/tp: at H = 128 both permutations are
# the same bytes and the pair proves nothing, as the first H200 run of 2026-11-26 showed), per-rank Marlin padding (I/tp = 160 -> 192); float Marlin at TP 2/4 and EP 2: FP8 block
# (marlin-fp8), MXFP8 (marlin-mxfp8, I/tp = 96 padded to 128 per rank), MXFP4 (marlin-mxfp4),
# NVFP4 (marlin-nvfp4, each rank's own block-scale rescale factor). Humming (sm90's default) is
# not run here: its kernel needs humming-kernels' NVRTC JIT (.humming/run_moepack.sh); its ranks
# are checked on the CPU against humming's own transform (bench/humming/check_parallel_shapes.py).
set -uo pipefail
mode=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
carry=${CARRY:-$repo/.tpep2}
# SHA-256 of the decompressed library (as bench/gpu_marlin_float.sh): the wheel's file, or that
# file stripped and pruned to SASS sm_90 + all PTX.
KNOWN_SHA256="99682a5814b3081de7e4e95cc2c1cf1ba8f6139514ac4c5563dbad16c229a4c0
2faf8de11ee12ad54960a23ae48e3e398649e12d160c8dd9b80314ec5edba380"

# name format E H I group dtype
sources() {
  cat <<'SRC'
a  gptq            4 256 512  128 bf16
b  gptq            4 256 1024 128 bf16
c  gptq            4 128 320  32  bf16
d  awq             4 128 512  128 bf16
f8 fp8-block       4 128 512  0   bf16
mx modelopt-mxfp8  4 128 192  0   bf16
n4 modelopt-nvfp4  4 128 256  0   bf16
c4 ct-nvfp4        6 128 512  0   bf16
m4 ct-mxfp4        4 128 256  0   bf16
SRC
}

# case source layout expect note | convert flags
cases() {
  cat <<'CASES'
a-tp1            a  marlin       pass whole experts, same source|
a-tp2            a  marlin       pass |--tensor-parallel-size 2
a-tp4            a  marlin       pass group 128, I/tp = 128: the kernel's w13 scale permutation|--tensor-parallel-size 4
a-tp4-vllm-perm  a  marlin       fail group 128, I/tp = 128: vLLM's own loader permutation (size_k = I/tp), wrong for the kernel|--tensor-parallel-size 4 --vllm-w13-scale-size-k
a-ep2-linear     a  marlin       pass |--expert-parallel 2 --expert-placement linear
a-ep4-rr         a  marlin       pass |--expert-parallel 4 --expert-placement round_robin
a-ep3-linear     a  marlin       pass uneven: 2,1,1 experts|--expert-parallel 3
b-tp8            b  marlin       pass group 128, I/tp = 128|--tensor-parallel-size 8
b-tp8-vllm-perm  b  marlin       fail group 128, I/tp = 128: vLLM's loader permutation|--tensor-parallel-size 8 --vllm-w13-scale-size-k
c-tp2-padded     c  marlin       pass I/tp = 160 -> Marlin pads to 192 per rank|--tensor-parallel-size 2
d-awq-tp2        d  marlin       pass zero points split per rank|--tensor-parallel-size 2
d-awq-ep2        d  marlin       pass |--expert-parallel 2
f8-tp2           f8 marlin-fp8   pass FP8 block 128x128, I/tp = 256|--tensor-parallel-size 2
f8-tp4           f8 marlin-fp8   pass FP8 block, I/tp = 128|--tensor-parallel-size 4
f8-ep2           f8 marlin-fp8   pass |--expert-parallel 2
mx-tp2           mx marlin-mxfp8 pass I/tp = 96 padded to 128 per rank|--tensor-parallel-size 2
mx-ep2-rr        mx marlin-mxfp8 pass |--expert-parallel 2 --expert-placement round_robin
n4-tp2           n4 marlin-nvfp4 pass each rank's own rescale factor 2^k|--tensor-parallel-size 2
n4-tp4           n4 marlin-nvfp4 pass I/tp = 64|--tensor-parallel-size 4
n4-ep2           n4 marlin-nvfp4 pass |--expert-parallel 2
c4-tp2           c4 marlin-nvfp4 pass compressed-tensors NVFP4|--tensor-parallel-size 2
c4-ep3-rr        c4 marlin-nvfp4 pass |--expert-parallel 3 --expert-placement round_robin
m4-tp2           m4 marlin-mxfp4 pass |--tensor-parallel-size 2
m4-ep2           m4 marlin-mxfp4 pass |--expert-parallel 2
CASES
}

prepare() {
  local bin=$1 xz=$2
  rm -rf "$carry" && mkdir -p "$carry/cases"
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$xz" "$carry/moe.so"
  local sum
  sum=$(sha256sum "$carry/moe.so" | cut -d' ' -f1)
  grep -qx "$sum" <<<"$KNOWN_SHA256" || { echo "unknown _moe_C library (sha256 $sum)"; exit 3; }
  echo "$sum  moe.so" >"$carry/moe.sha256"
  rm "$carry/moe.so" && cp "$xz" "$carry/moe.so.xz"
  "$bin" --version >"$carry/moepack.version"  # which build wrote the cases
  sources | while read -r s fmt E H I g dt; do
    local gs=()
    [ "$g" != 0 ] && gs=(--group-size "$g")
    "$bin" synth "$carry/cases/_src-$s" --format "$fmt" --layers 1 --experts "$E" --hidden "$H" \
      --inter "$I" "${gs[@]}" --dtype "$dt" --vocab 64 --seed 7 --threads 1 >/dev/null || exit 1
  done
  cases | while IFS='|' read -r head flags; do
    read -r c s layout expect note <<<"$head"
    # CASE_FILTER (an extended regex on the case name) prepares a subset: the whole carry (~31
    # MiB) does not fit beside the tree (~42 MB) in one device call's 64 MiB, so the int4 and the
    # float cases go in two calls (CASE_FILTER='^[abcd]-' and CASE_FILTER='^(f8|mx|n4|c4|m4)-').
    [[ $c =~ ${CASE_FILTER:-.} ]] || continue
    local d=$carry/cases/$c fmt bits=4 arch=sm90
    fmt=$(sources | awk -v s="$s" '$1 == s {print $2}')
    [ "$layout" != marlin ] && arch=sm80
    mkdir -p "$d"
    # shellcheck disable=SC2086
    "$bin" convert "$carry/cases/_src-$s" "$d/out" --vllm-target 0.33 --target-arch "$arch" \
      --backend "$layout" --threads 1 $flags >/dev/null || { echo "$c: convert failed"; exit 1; }
    if [ "$expect" = pass ]; then
      "$bin" verify "$d/out" --source "$carry/cases/_src-$s" --tokens 8 >/dev/null ||
        { echo "$c: verify failed"; exit 1; }
    fi
    local decode=$fmt extra=""
    [ "$fmt" = gptq ] || [ "$fmt" = awq ] || extra=", \"layout\": \"$layout\""
    printf '{"src": "../_src-%s", "decode": "%s", "bits": %d%s, "act": "bf16", "expect": "%s", "note": "%s"}\n' \
      "$s" "$decode" "$bits" "$extra" "$expect" "$note" >"$d/case.json"
  done || exit 1
  # The sources no prepared case reads stay behind (CASE_FILTER).
  for src in "$carry"/cases/_src-*; do
    grep -qs "\"src\": \"../$(basename "$src")\"" "$carry"/cases/*/case.json || rm -rf "$src"
  done
  # Only the experts travel (the rest of each checkpoint is copied through, untouched).
  find "$carry/cases" -name '*.safetensors' | while read -r f; do
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
  du -sh "$carry" "$carry/cases"
}

run() {
  local out=${OUT:-/tmp/out} w=/tmp/gpu_parallel
  mkdir -p "$out" "$w"
  export CUDA_MODULE_LOADING=LAZY CUDA_CACHE_MAXSIZE=4294967296 PYTHONUNBUFFERED=1
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))'
  } >"$out/env.txt" 2>&1
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$carry/moe.so.xz" "$w/moe.so"
  (cd "$w" && sha256sum -c "$carry/moe.sha256") >>"$out/env.txt" 2>&1 || { cat "$out/env.txt"; exit 3; }
  cat "$carry/moepack.version" >>"$out/env.txt" 2>/dev/null
  cat "$out/env.txt"
  timeout "${PARALLEL_TIMEOUT:-420}" python3 "$repo/tests/vllm/gpu_parallel_kernel.py" "$w/moe.so" \
    "$carry/cases" --json "$out/parallel.json" 2>&1 | tee "$out/parallel.log"
  return "${PIPESTATUS[0]}"
}

case $mode in
  prepare) prepare "${2:?moepack binary}" "${3:?_moe_C .so.xz}" ;;
  run) run ;;
  *) echo "usage: $0 prepare MOEPACK_BIN MOE_SO_XZ | run"; exit 2 ;;
esac
