#!/usr/bin/env bash
# The source fingerprint's cost (issue 28 item 6): convert by several builds of moepack, runs
# interleaved (A, B, C, A, B, C, ...) on the same sources with a warm page cache, wall time and
# CPU time (user + system, /usr/bin/time) per run, the load average before and after, and the
# SHA-256 of every tensor file checked equal across the builds. Prints a markdown table of each
# build's median over the runs (and every run's numbers).
#
#   bash bench/fingerprint_cost.sh WORKDIR RUNS LABEL=MOEPACK [LABEL=MOEPACK ...]
#
# Sources (made once in WORKDIR by the first build's synth; kept): qwen3, 9 layers x 32 experts,
# H 1024, vocab 16000: GPTQ int4 g128 (I 768, ~429 MB) -> marlin sm90 and ModelOpt MXFP8 (I 384,
# ~419 MB) -> trtllm-mxfp8 sm100, the cheapest (direct) paths, where a fixed cost per source byte
# weighs most, and the same GPTQ through the canonical form (--no-fast-path, "gptq-canonical").
# PATHS (default "gptq mxfp8 gptq-canonical") picks among them; THREADS (default 2) is convert's
# --threads.
set -euo pipefail
work=${1:?usage: fingerprint_cost.sh WORKDIR RUNS LABEL=MOEPACK...}
runs=${2:?RUNS}
shift 2
threads=${THREADS:-2}
builds=("$@")
first=${builds[0]#*=}
mkdir -p "$work"
shape=(--family qwen3 --layers 9 --experts 32 --hidden 1024 --vocab 16000 --seed 1)
[ -d "$work/src-gptq" ] || "$first" synth "$work/src-gptq" --format gptq --inter 768 "${shape[@]}" >/dev/null 2>&1
[ -d "$work/src-mxfp8" ] || "$first" synth "$work/src-mxfp8" --format modelopt-mxfp8 --inter 384 "${shape[@]}" >/dev/null 2>&1
paths=${PATHS:-gptq mxfp8 gptq-canonical}
flags_gptq=(--backend marlin --target-arch sm90)
flags_mxfp8=(--backend trtllm-mxfp8 --target-arch sm100)
flags_gptq_canonical=(--backend marlin --target-arch sm90 --no-fast-path)
cat "$work"/src-*/*.safetensors >/dev/null  # warm page cache
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" >&2
: >"$work/runs.tsv"
for r in $(seq 1 "$runs"); do
  for path in $paths; do
    for b in "${builds[@]}"; do
      label=${b%%=*} bin=${b#*=}
      dst=$work/dst-$path-$label
      flags_var="flags_${path//-/_}[@]"
      /usr/bin/time -f "%e %U %S" -o "$work/time.txt" "$bin" convert "$work/src-${path%-canonical}" "$dst" \
        "${!flags_var}" --threads "$threads" --force >/dev/null 2>&1
      read -r wall user sys <"$work/time.txt"
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$path" "$label" "$r" "$wall" "$user" "$sys" >>"$work/runs.tsv"
      (cd "$dst" && sha256sum ./*.safetensors) >"$work/sums-$path-$label.txt"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for path in $paths; do
  for b in "${builds[@]:1}"; do
    cmp -s "$work/sums-$path-${builds[0]%%=*}.txt" "$work/sums-$path-${b%%=*}.txt" ||
      { echo "tensor files differ: $path ${builds[0]%%=*} vs ${b%%=*}" >&2; exit 1; }
  done
done
python3 - "$work/runs.tsv" <<'PY'
import statistics, sys
rows = [l.split('\t') for l in open(sys.argv[1]).read().split('\n') if l]
paths = sorted({r[0] for r in rows}, key=[r[0] for r in rows].index)
labels = sorted({r[1] for r in rows}, key=[r[1] for r in rows].index)
print('| path | build | wall s (median; runs) | CPU s user + sys (median; runs) |')
print('| --- | --- | --- | --- |')
for p in paths:
    for l in labels:
        rs = [r for r in rows if r[0] == p and r[1] == l]
        wall = [float(r[3]) for r in rs]
        cpu = [float(r[4]) + float(r[5]) for r in rs]
        print(f'| {p} | {l} | {statistics.median(wall):.2f} ({", ".join(f"{w:.2f}" for w in wall)}) | '
              f'{statistics.median(cpu):.2f} ({", ".join(f"{c:.2f}" for c in cpu)}) |')
PY
