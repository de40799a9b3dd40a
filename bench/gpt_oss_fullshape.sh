#!/usr/bin/env bash
# convert and verify of a synthetic gpt-oss at gpt-oss-120b's expert shape (128 experts, H = I =
# 2880, top-4, `moepack synth --format gpt-oss-mxfp4`), LAYERS MoE layers of its 36 (~1.7 GB of
# MXFP4 experts a layer: the 36 need ~57 GB per copy, so a 64 GB disk takes some layers, a 235 GB
# one all). Prints, each from a cold start of the command (the files in the page cache, as after
# synth), wall seconds and peak RSS of:
#   synth                          the source
#   convert --target-arch sm90     triton-mxfp4 (vLLM 0.33's TRITON, its default on Hopper)
#   convert ... --backend marlin-mxfp4   Marlin (vLLM's --moe-backend marlin)
#   verify DST --source SRC        of each on the CPU (CPU_VERIFY=0 leaves it out: ~100 s for 4
#                                  layers on 16 cores), and verify --device cuda of the triton-mxfp4
#                                  output with and without --source (the CUDA runtime adds gpt-oss'
#                                  expert biases and computes its clamped SwiGLU)
#   cat                            of the source and of each output (the copy baseline)
# Steps that would start after BUDGET_S seconds are skipped (said so).
#
#   bash bench/gpt_oss_fullshape.sh MOEPACK [LAYERS] [WORK]     (THREADS, BUDGET_S, EXPERTS, HIDDEN,
#                                                                INTER, TOPK override the shape;
#                                                                CPU_VERIFY=0 leaves the CPU verify out)
set -uo pipefail
bin=${1:?moepack binary}
layers=${2:-4}
work=${3:-/tmp/gpt-oss-full}
E=${EXPERTS:-128} H=${HIDDEN:-2880} I=${INTER:-2880} K=${TOPK:-4}
threads=${THREADS:-0}
budget=${BUDGET_S:-360}
start=$(date +%s)
rm -rf "$work" && mkdir -p "$work" || exit 1
echo "gpt-oss synthetic: $layers layers x $E experts, H $H, I $I, top-$K; $(nproc) CPUs;" \
  "load $(cut -d' ' -f1-3 /proc/loadavg); $("$bin" --version | head -2 | tr '\n' ' ')"
df -h "$work" | tail -1

# timed NAME CMD...: wall seconds and peak RSS (the child's ru_maxrss), exit code; stderr tail.
timed() {
  local name=$1
  shift
  if [ $(($(date +%s) - start)) -gt "$budget" ]; then
    echo "| $name | skipped: past BUDGET_S=$budget s | | |"
    return 0
  fi
  python3 - "$name" "$work/$name.err" "$@" <<'PY'
import resource, subprocess, sys, time
name, err, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
t = time.perf_counter()
with open(err, "w") as e:
    rc = subprocess.call(cmd, stdout=subprocess.DEVNULL, stderr=e)
dt = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1048576  # KiB -> GiB
print(f"| {name} | {dt:.2f} | {rss:.2f} | {rc} |", flush=True)
PY
  grep -E "^(summary|moepack: error|error)" "$work/$name.err" | tail -2 | sed 's/^/    /'
}
dir_bytes() { du -sb "$1" 2>/dev/null | cut -f1; }

echo "| step | seconds | peak RSS GiB | exit |"
echo "|---|---|---|---|"
timed synth "$bin" synth "$work/src" --format gpt-oss-mxfp4 --layers "$layers" --experts "$E" \
  --hidden "$H" --inter "$I" --top-k "$K" --seed 120 --threads "$threads"
timed cat_src sh -c "cat '$work'/src/*.safetensors > /dev/null"
timed convert_triton "$bin" convert "$work/src" "$work/triton" --target-arch sm90 --threads "$threads"
timed cat_triton sh -c "cat '$work'/triton/*.safetensors > /dev/null"
[ "${CPU_VERIFY:-1}" = 1 ] &&
  timed verify_triton "$bin" verify "$work/triton" --source "$work/src" --threads "$threads"
timed verify_triton_cuda "$bin" verify "$work/triton" --device cuda --threads "$threads"
timed verify_triton_cuda_source "$bin" verify "$work/triton" --source "$work/src" --device cuda \
  --threads "$threads"
rm -rf "$work/triton"  # the disk holds the source and one output at a time
timed convert_marlin "$bin" convert "$work/src" "$work/marlin" --target-arch sm90 \
  --backend marlin-mxfp4 --threads "$threads"
timed cat_marlin sh -c "cat '$work'/marlin/*.safetensors > /dev/null"
[ "${CPU_VERIFY:-1}" = 1 ] &&
  timed verify_marlin "$bin" verify "$work/marlin" --source "$work/src" --threads "$threads"
timed verify_marlin_cuda "$bin" verify "$work/marlin" --source "$work/src" --device cuda \
  --threads "$threads"
echo "source $(($(dir_bytes "$work/src") / 1000000)) MB, marlin output" \
  "$(($(dir_bytes "$work/marlin" || echo 0) / 1000000)) MB; total $(($(date +%s) - start)) s"
rm -rf "$work"
