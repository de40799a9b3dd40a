#!/usr/bin/env bash
# Whole-model `verify` against reading the files (issue 27: `verify --device cuda` <= 1.5x `cat`),
# measured in one run with the load average before and after and the peak resident memory.
# Expected invocation, one device call from the repository root (build-gpu built as in
# bench/gpu_run.sh; logs and numbers under $OUT):
#
#   OUT=$OUT bash bench/verify_gpu.sh build-gpu/bin/moepack /tmp/verify-bench
#
# Synthesises a Qwen3-30B-A3B-shaped GPTQ int4 g128 checkpoint (E=128, H=2048, I=768; LAYERS=29
# gives 28 MoE layers, 9.75 GB converted), converts it to BACKEND (default marlin: the issue's
# layout, named because `auto` picks humming for sm90 since the vLLM 0.33 order has it first),
# then with a warm page cache (the files are read once first) times `cat` of the converted shards (CAT_RUNS times, the median)
# and `verify` (without --source: integrity + the layout's MoE against its decoding) and prints
# the ratio, the peak resident memory (/usr/bin/time's maximum RSS of the timed run, and
# verify's own sampled anonymous / file-backed peaks) and where verify's time went (the stages of
# its --json "run": read_hash, decode, wait, stage, evaluate, and the MoE kernels' device seconds).
#
# Environment:
#   LAYERS=N     decoder layers (default 29); LAYERS=3 is a smoke test that fits 2 cores
#   DEVICES=...  the verify devices timed, in order (default "cuda" with a GPU, else "cpu";
#                e.g. DEVICES="cuda cpu" for both: the CPU path's ratio to cat too)
#   SOURCE=1     also time `verify --source` on each device
#   BACKEND=...  the layout converted to (default marlin)
#   THREADS=N    verify --threads (default 0: every CPU)
#   PROFILE=0    no per-kernel profile of --device cuda (default on: after the timed runs, one
#                more run of each device with MOEPACK_VERIFY_PROFILE=1, each kernel and upload
#                timed by its own CUDA events, printed under its stages; that run's seconds are
#                not the ratio: the events and their per-layer synchronisation cost time)
set -euo pipefail
M=${1:-build-gpu/bin/moepack}
work=${2:-/tmp/verify-bench}
OUT=${OUT:-$work/out}
LAYERS=${LAYERS:-29}
BACKEND=${BACKEND:-marlin}
THREADS=${THREADS:-0}
if [ -z "${DEVICES:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    DEVICES=cuda
  else
    DEVICES=cpu
  fi
fi
mkdir -p "$work" "$OUT"
log="$OUT/verify_gpu.txt"
src=$work/src dst=$work/dst
# A converted model of another shape or layout is made again.
shape="layers=$LAYERS backend=$BACKEND"
if [ ! -d "$dst" ] || [ "$(cat "$work/shape" 2>/dev/null)" != "$shape" ]; then
  rm -rf "$src" "$dst"
  "$M" synth "$src" --format gptq --family qwen3 --layers "$LAYERS" --experts 128 --hidden 2048 \
    --inter 768 --top-k 8 --vocab 32000 --seed 1 --max-shard-size 4GB > "$OUT/synth.txt"
  t0=$(date +%s.%N)
  "$M" convert "$src" "$dst" --target-arch sm90 --backend "$BACKEND" > "$OUT/convert.txt"
  t1=$(date +%s.%N)
  echo "$shape" > "$work/shape"
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "convert: %.2f s\n", b - a }' | tee -a "$log"
fi
{
  echo "$("$M" --version | tr "\n" " ")cores: $(nproc)  $shape  devices: $DEVICES"
  du -sb "$dst" | awk '{printf "converted: %.2f GB\n", $1/1e9}'
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee -a "$log"
cat "$dst"/*.safetensors > /dev/null  # warm the page cache for every run
# cat timed CAT_RUNS times (default 3; one cat of a warm 10 GB varies by 20 % on the H100 host):
# the ratio is to their median.
cats=()
for _ in $(seq "${CAT_RUNS:-3}"); do
  t0=$(date +%s.%N)
  cat "$dst"/*.safetensors > /dev/null
  t1=$(date +%s.%N)
  cats+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')")
done
cat_s=$(printf '%s\n' "${cats[@]}" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
echo "cat: $cat_s s (median of ${cats[*]})" | tee -a "$log"

# One timed verify: seconds, exit code, maximum RSS, verify's own peaks and stages.
timed_verify() {
  local name=$1
  shift
  local json="$OUT/verify_$name.json" tv="$OUT/verify_${name}_time.txt" rc=0 a b
  local profile=0
  case $name in *_profiled) profile=1 ;; esac
  a=$(date +%s.%N)
  MOEPACK_VERIFY_PROFILE=$profile /usr/bin/time -v "$M" verify "$dst" "$@" \
    --threads "$THREADS" --json > "$json" 2> "$tv" || rc=$?
  b=$(date +%s.%N)
  python3 - "$json" "$tv" "$a" "$b" "$cat_s" "$rc" "$name" <<'EOF' | tee -a "$log"
import json, re, sys
path, tv, a, b, cat_s, rc, name = sys.argv[1:]
secs = float(b) - float(a)
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(tv).read())
rss_gib = int(rss.group(1)) / 2**20 if rss else float("nan")
print(f"verify {name}: {secs:.2f} s (exit {rc}); ratio verify / cat = {secs / float(cat_s):.2f}; "
      f"max RSS {rss_gib:.2f} GiB")
try:
    r = json.load(open(path))
except ValueError:
    print("  no JSON report"); sys.exit(0)
run = r.get("run", {})
worst = max((l["norm_err"] for l in r.get("layers", []) if l["norm_err"] is not None), default=None)
print(f"  passed {r.get('passed')}, layers {len(r.get('layers', []))}, worst norm_err {worst}; "
      f"peak anonymous {run.get('peak_rss_anon_bytes', 0) / 2**20:.0f} MiB, "
      f"peak file-backed {run.get('peak_rss_file_bytes', 0) / 2**20:.0f} MiB")
st = run.get("stages", {})
if st:
    dev = st.get("device_seconds", 0)
    print(f"  stages (busy seconds over threads): lanes {st['lanes']}, read+hash "
          f"{st['read_hash_seconds']:.2f}, decode {st['decode_seconds']:.2f}, wait "
          f"{st['wait_seconds']:.2f}, stage {st.get('stage_seconds', 0):.2f}, evaluate "
          f"{st['evaluate_seconds']:.2f}, device kernels "
          f"{dev:.3f} ({100 * dev / secs:.1f} % of the run)")
# --device cuda with MOEPACK_VERIFY_PROFILE: each kernel's and upload's device seconds, and the
# host's staging (verify's stderr).
for line in open(tv):
    if line.startswith("moepack: verify profile"):
        print("  " + line.split("moepack: ", 1)[1].rstrip())
EOF
}

for d in $DEVICES; do
  timed_verify "$d" --device "$d"
  if [ "${SOURCE:-0}" = 1 ]; then
    timed_verify "${d}_source" --device "$d" --source "$src"
  fi
done
if [ "${PROFILE:-1}" != 0 ]; then
  for d in $DEVICES; do
    timed_verify "${d}_profiled" --device "$d"
  done
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
