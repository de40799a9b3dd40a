#!/usr/bin/env bash
# One run on a machine, ready for bench/RESULTS.md (issue 13):
#
#   MOEPACK=$PWD/build-gpu/bin/moepack bash bench/bench_convert.sh /tmp/bench
#
# For each path (GPTQ -> Marlin, CT W4A16 -> Marlin, AWQ -> Marlin, ModelOpt MXFP8 -> TRT-LLM
# sm100) on a synthetic checkpoint of ~1.7 GB (8 MoE layers x 64 experts, H 2048; I 768 for int4,
# 384 for MXFP8 so the bytes are alike), and gpt-oss MXFP4 -> triton-mxfp4 / marlin-mxfp4 (sm90)
# on one synthetic gpt-oss of ~1.7 GB (4 MoE layers x 32 experts at gpt-oss-120b's H = I = 2880): `cp -r` of the source and a convert at the default
# threads, both with a warm page cache (the source is read once first) and both ending on disk
# (sync; convert fsyncs), the ratio of their medians over REPS runs, MB/s (source bytes / convert time), peak anonymous and
# file-backed RSS (convert --json, sampled in-process every 10 ms) and peak total RSS (the
# kernel's maximum RSS of the process; cp's too), the 1-minute load average just before the
# cp and just after the convert of each ratio, the stage busy times, then convert at
# --threads 1/2/4/8/16 with the SHA-256 of every output file checked equal to the first run's.
# Prints markdown tables and the machine (nproc, CPU, load average).
#
#   bench/bench_convert.sh [WORKDIR] [extra synth flags]     (sources are kept in WORKDIR)
# Environment: PATHS="gptq ct awq mxfp8 gptoss-triton gptoss-marlin" (a subset), THREADS="1 2 4 8
# 16", SHAPE (synth's --family/--layers/--experts/--hidden/--vocab), INTER_INT4=768,
# INTER_MXFP8=384, GPT_OSS_SHAPE (the gpt-oss paths' synth shape), REPS=3 (cp -r and convert
# pairs per path, the ratio of their medians; every run's seconds in the "runs" table).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
M=${MOEPACK:-$here/build/bin/moepack}
work=${1:-/tmp/moepack-bench}
shift || true
PATHS=${PATHS:-gptq ct awq mxfp8 gptoss-triton gptoss-marlin}
THREADS=${THREADS:-1 2 4 8 16}
REPS=${REPS:-3}
SHAPE=${SHAPE:---family qwen3 --layers 9 --experts 64 --hidden 2048 --vocab 32000}
INTER_INT4=${INTER_INT4:-768}
INTER_MXFP8=${INTER_MXFP8:-384}
GPT_OSS_SHAPE=${GPT_OSS_SHAPE:---layers 4 --experts 32 --hidden 2880 --inter 2880 --vocab 32000}
mkdir -p "$work"

# synth flags, convert flags and a label per path.
path_synth() {
  case $1 in
    gptq) echo "--format gptq --inter $INTER_INT4" ;;
    ct) echo "--format ct-w4a16 --inter $INTER_INT4" ;;
    awq) echo "--format awq --inter $INTER_INT4" ;;
    mxfp8) echo "--format modelopt-mxfp8 --inter $INTER_MXFP8" ;;
    gptoss-*) echo "--format gpt-oss-mxfp4 --family gpt_oss" ;;
  esac
}
path_shape() {
  case $1 in
    gptoss-*) echo "$GPT_OSS_SHAPE" ;;
    *) echo "$SHAPE" ;;
  esac
}
# The source directory (both gpt-oss paths read one source).
path_src() {
  case $1 in
    gptoss-*) echo "$work/src-gptoss" ;;
    *) echo "$work/src-$1" ;;
  esac
}
path_convert() {
  case $1 in
    mxfp8) echo "--backend trtllm-mxfp8 --target-arch sm100" ;;
    gptoss-triton) echo "--backend triton-mxfp4 --target-arch sm90" ;;
    gptoss-marlin) echo "--backend marlin-mxfp4 --target-arch sm90" ;;
    *) echo "--backend marlin --target-arch sm90" ;;
  esac
}
path_label() {
  case $1 in
    gptq) echo "GPTQ int4 -> Marlin" ;;
    ct) echo "CT W4A16 -> Marlin" ;;
    awq) echo "AWQ int4 -> Marlin" ;;
    mxfp8) echo "MXFP8 -> TRT-LLM (sm100)" ;;
    gptoss-triton) echo "gpt-oss MXFP4 -> triton-mxfp4 (sm90)" ;;
    gptoss-marlin) echo "gpt-oss MXFP4 -> marlin-mxfp4 (sm90)" ;;
  esac
}

# Runs "$@", then sync; prints "seconds max_rss_kib stdout-on-one-line".
timed() {
  python3 - "$@" <<'PY'
import resource, subprocess, sys, time
t = time.time()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE)
if p.returncode != 0:
    sys.exit("failed (%d): %s" % (p.returncode, " ".join(sys.argv[1:])))
subprocess.run(["sync"], check=True)
dt = time.time() - t
print("%.3f %d %s" % (dt, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                      p.stdout.decode().replace("\n", " ")))
PY
}

# The median of the arguments (the lower middle of an even count).
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

# SHA-256 of every file of an output, as one digest.
tree_sha() { (cd "$1" && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16); }

machine="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "machine: $machine; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "moepack: $("$M" --version 2>/dev/null || echo "$M")"
echo
main_rows=()
scale_rows=()
stage_rows=()
runs_rows=()
for p in $PATHS; do
  src=$(path_src "$p")
  if [ ! -f "$src/config.json" ]; then
    # shellcheck disable=SC2046
    "$M" synth "$src" $(path_synth "$p") $(path_shape "$p") --seed 1 --max-shard-size 2GB "$@" \
      >/dev/null
  fi
  src_bytes=$(du -sb "$src" | awk '{print $1}')
  cat "$src"/*.safetensors >/dev/null  # warm the page cache for every run
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  # REPS pairs of (cp -r, convert), each timed run starting with nothing dirty (the sync before
  # it: a timed run's own sync must flush its own writes only, not synth's or the run before's);
  # the ratio is of the medians. The convert's --json is the last run's.
  cps=() cvs=()
  for _ in $(seq "$REPS"); do
    rm -rf "$work/cp" "$work/out"
    sync
    read -r cp_s cp_kib _ <<<"$(timed cp -r "$src" "$work/cp")"
    rm -rf "$work/cp"
    sync
    # shellcheck disable=SC2046
    read -r cv_s hwm_kib json <<<"$(timed "$M" convert "$src" "$work/out" $(path_convert "$p") \
      --json --progress none)"
    cps+=("$cp_s") cvs+=("$cv_s")
  done
  cp_s=$(median "${cps[@]}") cv_s=$(median "${cvs[@]}")
  load_after=$(cut -d' ' -f1 /proc/loadavg)
  ref_sha=$(tree_sha "$work/out")
  read -r anon file stages <<<"$(echo "$json" | python3 -c '
import json, sys
j = json.load(sys.stdin)
s = j["stage_seconds"]
print(j["peak_rss_anon_bytes"] >> 20, j["peak_rss_file_bytes"] >> 20,
      " / ".join("%s %.2f" % (k, s[k]) for k in ("load", "pack", "write_wait", "copy", "write", "writer_idle", "finish") if k in s))')"
  main_rows+=("$(awk -v l="$(path_label "$p")" -v sb="$src_bytes" -v c="$cp_s" -v v="$cv_s" \
    -v a="$anon" -v f="$file" -v h="$hwm_kib" -v ch="$cp_kib" -v lb="$load_before" \
    -v la="$load_after" 'BEGIN {
    printf "| %s | %.2f GB | %.2f | %.2f | **%.2f** | %s -> %s | %.0f | %d | %d | %d | %d |", l,
      sb / 1e9, c, v, v / c, lb, la, sb / 1e6 / v, ch / 1024, a, f, h / 1024 }')")
  stage_rows+=("| $(path_label "$p") | $stages |")
  runs_rows+=("| $(path_label "$p") | ${cps[*]} | ${cvs[*]} |")
  row="| $(path_label "$p") |"
  same=yes
  for t in $THREADS; do
    rm -rf "$work/out-t"
    sync
    # shellcheck disable=SC2046
    read -r s _ <<<"$(timed "$M" convert "$src" "$work/out-t" $(path_convert "$p") --threads "$t" \
      --progress none)"
    [ "$(tree_sha "$work/out-t")" = "$ref_sha" ] || same="**NO**"
    row="$row $s |"
  done
  rm -rf "$work/out-t" "$work/out"
  scale_rows+=("$row $same ($ref_sha) |")
done

echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| path | source | cp -r s (median) | convert s (median) | convert / cp | load average (1 min) before cp -> after convert | MB/s | cp -r peak RSS MiB | convert peak anon MiB | peak file MiB | peak total MiB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${main_rows[@]}"
echo
hdr="| path |"
sep="|---|"
for t in $THREADS; do
  hdr="$hdr --threads $t s |"
  sep="$sep---|"
done
echo "$hdr output SHA-256 identical |"
echo "$sep---|"
printf '%s\n' "${scale_rows[@]}"
echo
echo "| path | stage busy seconds (convert at the default threads) |"
echo "|---|---|"
printf '%s\n' "${stage_rows[@]}"
echo
echo "| path | cp -r s (each run) | convert s (each run) |"
echo "|---|---|---|"
printf '%s\n' "${runs_rows[@]}"
