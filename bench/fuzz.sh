#!/usr/bin/env bash
# Fuzzing at scale: every libFuzzer target of a MOEPACK_FUZZ build, all at once, to a given number
# of executions each, from the committed seed corpora (tests/fuzz/corpus/<target>) with their
# dictionaries (tests/fuzz/dict/<target>.dict). fuzz_unpack runs once per source codec row
# (MOEPACK_FUZZ_CODEC=<row>, the rows the binary lists), each its own target. CI's short run is
# tests/fuzz/run_fuzz.sh.
#
#   bench/fuzz.sh BIN_DIR RUNS OUT [CORES] [MAX_SECONDS] [ROUND_SECONDS]
#
# BIN_DIR holds the fuzz_* binaries; RUNS is the executions wanted per target (10000000 for the
# issue's 10 M); CORES the cores to fill (default: nproc); MAX_SECONDS bounds the whole run
# (default 0: none, one round to RUNS). With MAX_SECONDS the run goes in rounds of ROUND_SECONDS
# (default: all of it): each round runs every target still short of RUNS at once, resuming from
# its grown corpus, and shares the CORES among them by the work each has left: a target's work
# is the executions it still needs over its rate per process (exec/s of its last round, or
# RESUME_FROM's summary; equal before any), every target gets one process and each further core
# goes to the target whose work per process is the largest (so they finish together). A target
# with W > 1 processes runs as W libFuzzer workers (-jobs=W -workers=W) on one corpus folder,
# each to its share of the executions and picking up the others' finds (-reload); its
# executions are the sum of the workers' final stats. A target that reached RUNS or found
# something leaves, so the later rounds give the slow targets the cores the fast ones freed.
# FUZZ_FLAGS: libFuzzer flags added to every target's command (default
# -entropic_feature_frequency_threshold=16: with a grown corpus, libFuzzer's default of 255 keeps
# thousands of features "rare" after loading it, and its entropic bookkeeping then searches that
# list for most features of every execution, 40-50 % of the time of fuzz_moe_discovery and
# fuzz_unpack's FP8-block rows as measured; 16 keeps the rarest ~100 and entropic scheduling on).
# Under OUT: per target its logs (per round, and per worker), its grown corpus and any finding
# (crash-*, leak-*, timeout-*, oom-*; also copied under OUT/regressions/ in
# tests/fuzz/regressions' layout, tests/fuzz/README.md), and summary.tsv / summary.md:
# executions, seconds fuzzed (wall per round, whatever the workers), exec/s, coverage (cov and
# ft: the largest of the last round's workers' last status lines), corpus size, findings and
# rounds per target, and the processes of each round. Exit 1 on any finding. Where the
# repository is not next to BIN_DIR (the device's .fuzz/ carry), FUZZ_DATA names the folder
# holding corpus/ and dict/ (default: tests/fuzz beside this script).
set -uo pipefail
bin=$(realpath "${1:?usage: fuzz.sh BIN_DIR RUNS OUT [CORES] [MAX_SECONDS] [ROUND_SECONDS]}")
runs=${2:?RUNS}
out=${3:?OUT}
cores=${4:-$(nproc)}
max=${5:-0}
round_s=${6:-$max}
here=$(cd "$(dirname "$0")" && pwd)
data=${FUZZ_DATA:-$here/../tests/fuzz}
mkdir -p "$out"
out=$(realpath "$out")

# Source codec rows for fuzz_unpack, as the binary's registry lists them (formats/registry.cpp
# source_codecs()), so that a new row is fuzzed without editing this script.
codecs=$(MOEPACK_FUZZ_CODEC=list "$bin/fuzz_unpack") || { echo "fuzz_unpack: no codec list" >&2; exit 2; }
targets=()
for t in safetensors index hf_config quant_config manifest part_json moe_discovery; do
  targets+=("$t")
done
for c in $codecs; do targets+=("unpack:$c"); done
# TARGETS (an extended regex on the target's name, e.g. 'manifest|unpack_gptq') runs a subset.
if [ -n "${TARGETS:-}" ]; then
  picked=()
  for spec in "${targets[@]}"; do
    n=${spec%%:*}; [[ $spec == *:* ]] && n="${n}_${spec#*:}"
    [[ $n =~ ^(${TARGETS})$ ]] && picked+=("$spec")
  done
  targets=("${picked[@]}")
fi

name_of() { local t=${1%%:*} codec=""; [[ $1 == *:* ]] && codec=${1#*:}; echo "$t${codec:+_$codec}"; }

# Executions of one round: the sum of libFuzzer's final stats over the given logs (the one log, or
# one per worker).
round_execs() {
  cat "$@" 2>/dev/null | grep -o 'stat::number_of_executed_units: [0-9]*' |
    awk '{ n += $2 } END { print n + 0 }'
}

run_one() {  # target[:codec] round processes seconds runs_left
  local spec=$1 r=$2 procs=$3 secs=$4 left=$5 t=${1%%:*} codec=""
  [[ $spec == *:* ]] && codec=${spec#*:}
  local dir=$out/$t${codec:+_$codec}
  local dict=() limit=()
  [ -f "$data/dict/$t.dict" ] && dict=("-dict=$data/dict/$t.dict")
  [ "$secs" != 0 ] && limit+=("-max_total_time=$secs")
  # W workers: each its share of the executions (rounded up), all on the one corpus folder; each
  # writes fuzz-<i>.log in the current folder (libFuzzer's -jobs), renamed log-r<R>-w<i>.txt.
  [ "$procs" -gt 1 ] && limit+=("-jobs=$procs" "-workers=$procs") && left=$(((left + procs - 1) / procs))
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$dir" && rm -f fuzz-*.log &&
    MOEPACK_FUZZ_CODEC=$codec "$bin/fuzz_$t" "$dir/corpus" "${dict[@]}" "-runs=$left" \
      "${limit[@]}" $flags -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 \
      -artifact_prefix="$dir/findings/" >"$dir/log-r$r.txt" 2>&1)
  local rc=$?
  t1=$(date +%s.%N)
  local i=0
  while [ -f "$dir/fuzz-$i.log" ]; do mv "$dir/fuzz-$i.log" "$dir/log-r$r-w$i.txt"; i=$((i + 1)); done
  echo "$rc $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" >"$dir/status-r$r"
}
export -f run_one
flags=${FUZZ_FLAGS--entropic_feature_frequency_threshold=16}
export out data bin flags

for spec in "${targets[@]}"; do
  dir=$out/$(name_of "$spec")
  mkdir -p "$dir/corpus" "$dir/findings"
  cp "$data/corpus/${spec%%:*}/"* "$dir/corpus/" 2>/dev/null
  echo "0 0 0 0 0" >"$dir/total"  # executions, seconds, rounds, last rc, core-seconds
  : >"$dir/procs"                  # processes per round
  rm -f "$dir/rate"                # exec/s per process: the last round's (or RESUME_FROM's)
  # RESUME_FROM: an earlier run's OUT (its summary.tsv and fuzz-corpora.tar.gz unpacked there):
  # each target goes on from its grown corpus, and its executions, seconds, rounds and
  # core-seconds so far count towards RUNS (the summary then reports the runs together; a summary
  # without core_seconds ran one process per target).
  if [ -n "${RESUME_FROM:-}" ]; then
    [ -d "$RESUME_FROM/$(name_of "$spec")/corpus" ] &&
      cp "$RESUME_FROM/$(name_of "$spec")/corpus/"* "$dir/corpus/" 2>/dev/null
    awk -F'\t' -v n="$(name_of "$spec")" '$1 == n { print $2, $3, $9, 0, ($11 != "" ? $11 : $3) }' \
      "$RESUME_FROM/summary.tsv" 2>/dev/null | grep . >"$dir/total.prev" && mv "$dir/total.prev" "$dir/total"
    rm -f "$dir/total.prev"
    read -r execs _ _ _ core_s <"$dir/total"
    awk -v e="$execs" -v c="$core_s" 'BEGIN { if (c > 0 && e > 0) printf "%.1f\n", e / c }' |
      grep . >"$dir/rate" || rm -f "$dir/rate"
  fi
done

# Processes per target for one round: lines "spec executions_left rate" in, "spec processes" out;
# $1 cores, $2 the seconds the whole run has left (0: no bound). Every target gets one process.
# With a bound, the targets with the least work (executions left / rate) first get what they need
# to finish within it, so that as many as possible reach RUNS when the cores cannot finish all;
# the cores left over (all of them without a bound) go one by one to the target with the most
# work per process. A target with no rate yet counts at the mean rate of the others (all equal
# when none has one).
share_cores() {
  awk -v cores="$1" -v bound="$2" '
    { spec[NR] = $1; need[NR] = $2; rate[NR] = $3; if ($3 > 0) { sum += $3; known++ } }
    END {
      mean = known ? sum / known : 1
      for (i = 1; i <= NR; i++) { if (rate[i] <= 0) rate[i] = mean; work[i] = need[i] / rate[i]; procs[i] = 1 }
      free = cores - NR
      if (bound > 0) {
        for (i = 1; i <= NR; i++) order[i] = i
        for (i = 1; i <= NR; i++)  # by work, least first
          for (j = i + 1; j <= NR; j++)
            if (work[order[j]] < work[order[i]]) { t = order[i]; order[i] = order[j]; order[j] = t }
        for (i = 1; i <= NR && free > 0; i++) {
          want = int(work[order[i]] / bound) + (work[order[i]] % bound > 0) - 1
          if (want > free) want = free
          if (want > 0) { procs[order[i]] += want; free -= want }
        }
      }
      for (; free > 0; free--) {
        best = 1
        for (i = 2; i <= NR; i++)
          if (work[i] / procs[i] > work[best] / procs[best]) best = i
        procs[best]++
      }
      for (i = 1; i <= NR; i++) print spec[i], procs[i]
    }'
}

start=$(date +%s)
r=0
while :; do
  left=()
  for spec in "${targets[@]}"; do
    dir=$out/$(name_of "$spec")
    read -r execs _ _ rc _ <"$dir/total"
    [ "$execs" -ge "$runs" ] || [ -n "$(ls -A "$dir/findings")" ] || [ "$rc" != 0 ] || left+=("$spec")
  done
  [ ${#left[@]} -gt 0 ] || break
  secs=0
  if [ "$max" != 0 ]; then
    remaining=$((max - ($(date +%s) - start)))
    [ "$remaining" -ge 20 ] || break  # too little for a round: startup would dominate
    secs=$((remaining < round_s ? remaining : round_s))
  fi
  r=$((r + 1))
  plan=$(for spec in "${left[@]}"; do
    dir=$out/$(name_of "$spec")
    read -r execs _ _ _ _ <"$dir/total"
    echo "$spec $((runs - execs)) $(cat "$dir/rate" 2>/dev/null || echo 0)"
  done | share_cores "$cores" "$([ "$max" != 0 ] && echo $((remaining * 9 / 10)) || echo 0)")
  echo "round $r: ${#left[@]} targets, ${secs}s, processes:" $plan >&2
  echo "$plan" | while read -r spec procs; do
    dir=$out/$(name_of "$spec")
    read -r execs _ _ _ _ <"$dir/total"
    echo "$spec $r $procs $secs $((runs - execs))"
  done | xargs -P "${#left[@]}" -L 1 bash -c 'run_one "$@"' _
  echo "$plan" | while read -r spec procs; do
    dir=$out/$(name_of "$spec")
    read -r execs fuzzed rounds _ core_s <"$dir/total"
    read -r rc s <"$dir/status-r$r"
    # With workers, theirs (the -jobs parent's own log repeats each worker's when it exits).
    if [ "$procs" -gt 1 ]; then n=$(round_execs "$dir"/log-r$r-w*.txt); else n=$(round_execs "$dir/log-r$r.txt"); fi
    echo "$((execs + n)) $(awk -v a="$fuzzed" -v b="$s" 'BEGIN { print a + b }') $((rounds + 1)) $rc" \
      "$(awk -v a="$core_s" -v b="$s" -v p="$procs" 'BEGIN { print a + b * p }')" >"$dir/total"
    awk -v n="$n" -v s="$s" -v p="$procs" 'BEGIN { if (n > 0 && s > 0) printf "%.1f\n", n / s / p }' |
      grep . >"$dir/rate.new" && mv "$dir/rate.new" "$dir/rate"
    rm -f "$dir/rate.new"
    echo "$r $procs" >>"$dir/procs"
  done
  [ "$max" != 0 ] || break
done

# Findings in the layout of tests/fuzz/regressions (each a reproducer the replay tests run through
# the same entry point; a pinned codec's under MOEPACK_FUZZ_CODEC=<row>/): copy OUT/regressions/*
# into tests/fuzz/regressions/ and the finding is a failing test until it is fixed.
for spec in "${targets[@]}"; do
  t=${spec%%:*}
  codec=""
  [[ $spec == *:* ]] && codec=${spec#*:}
  src=$out/$t${codec:+_$codec}/findings
  dst=$out/regressions/$t${codec:+/MOEPACK_FUZZ_CODEC=$codec}
  if [ -n "$(ls -A "$src" 2>/dev/null)" ]; then mkdir -p "$dst" && cp "$src"/* "$dst/"; fi
done

# Summary: executions (all rounds), seconds fuzzed (wall), exec/s, cov and ft (the largest over
# the last round's logs' last status lines), corpus entries, findings, rounds, the last round's
# exit code, core-seconds (seconds x processes, summed over rounds) and the processes per round.
status=0
{
  printf 'target\texecutions\tseconds\texec_per_s\tcov\tft\tcorpus\tfindings\trounds\trc\tcore_seconds\tprocesses\n'
  for spec in "${targets[@]}"; do
    name=$(name_of "$spec")
    dir=$out/$name
    read -r execs secs rounds rc core_s <"$dir/total"
    lastr=$(awk 'END { print $1 }' "$dir/procs")
    cov=? ft=?
    if [ -n "$lastr" ]; then
      read -r cov ft < <(for l in "$dir/log-r$lastr.txt" "$dir"/log-r$lastr-w*.txt; do
        [ -f "$l" ] && grep -E '^#[0-9]+' "$l" | tail -1
      done | awk '{ for (i = 1; i < NF; i++) { if ($i == "cov:" && $(i + 1) > c) c = $(i + 1)
                                             if ($i == "ft:" && $(i + 1) > f) f = $(i + 1) } }
                  END { print (c ? c : "?"), (f ? f : "?") }')
    fi
    procs=$(awk '{ printf "%s%s", (NR > 1 ? "," : ""), $2 }' "$dir/procs")
    corpus=$(find "$dir/corpus" -type f | wc -l)
    findings=$(find "$dir/findings" -type f | wc -l)
    rate=$(awk -v e="$execs" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0 ? e / s : 0) }')
    printf '%s\t%s\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\n' "$name" "$execs" "$secs" "$rate" \
      "${cov:-?}" "${ft:-?}" "$corpus" "$findings" "$rounds" "$rc" "$core_s" "${procs:--}"
    if [ "$findings" != 0 ] || [ "$rc" != 0 ]; then status=1; fi
  done
} >"$out/summary.tsv"
{
  echo "| target | executions | seconds | exec/s | cov | ft | corpus | findings | rounds | rc | core-s | processes |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
  tail -n +2 "$out/summary.tsv" | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 }'
} >"$out/summary.md"
cat "$out/summary.md"
exit $status
