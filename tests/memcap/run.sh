#!/usr/bin/env bash
# The memory-cap conversion (issue 13): a GPTQ checkpoint larger than a cap on anonymous memory
# converts and verifies under that cap, and convert's peak anonymous memory stays within
# 2 x the largest MoE layer + 256 MiB.
#
#   MOEPACK_MEMCAP=1 ctest --test-dir build -L memcap --output-on-failure     (~10 min on 2 cores)
#   bash tests/memcap/run.sh build/bin/moepack [WORKDIR]
#
# The cap is RLIMIT_DATA (`ulimit -d`, the same as `prlimit --data`): it counts the heap and
# private writable mappings -- everything a conversion allocates -- but not the read-only
# mappings of the source shards, which are page cache the kernel can drop (cgroup MemoryMax would
# count those too, and no cgroup is writable on the machines this runs on). A first check shows
# the cap is enforced here: a 3 GiB allocation under it fails.
#
# Default: 20 MoE layers x 64 experts, H 2048, I 1536, int4 g128 = 7.1 GB (6.6 GiB) on disk,
# under a 2 GiB cap. Environment: MEMCAP_KIB (cap), MEMCAP_KEEP_SOURCE=1 (keep WORKDIR/src for a rerun).
# Exit 77 (skipped) unless MOEPACK_MEMCAP=1 or run by hand with arguments, or when the disk lacks
# room for the source and the output.
set -euo pipefail
M=${1:?usage: run.sh MOEPACK [WORKDIR]}
if [ "${MOEPACK_MEMCAP:-}" != 1 ] && [ $# -lt 2 ]; then
  echo "memcap: skipped (set MOEPACK_MEMCAP=1 to run the ~10 minute memory-cap conversion)"
  exit 77
fi
WORK=${2:-${TMPDIR:-/tmp}/moepack-memcap}
CAP_KIB=${MEMCAP_KIB:-$((2 * 1024 * 1024))}
mkdir -p "$WORK"
free_kib=$(df -Pk "$WORK" | awk 'NR == 2 {print $4}')
if [ ! -d "$WORK/src" ] && [ "$free_kib" -lt $((14 * 1024 * 1024)) ]; then
  echo "memcap: skipped: $WORK has $((free_kib / 1024)) MiB free, needs 14 GiB"
  exit 77
fi
cleanup() {
  rm -rf "$WORK/dst"
  [ "${MEMCAP_KEEP_SOURCE:-}" = 1 ] || rm -rf "$WORK/src"
}
trap cleanup EXIT

# The cap bites on this kernel.
if (ulimit -d "$CAP_KIB" && exec python3 -c 'bytearray(3 << 30)') 2>/dev/null; then
  echo "memcap: FAIL: a 3 GiB allocation succeeded under ulimit -d $CAP_KIB: the cap is not enforced"
  exit 1
fi

if [ ! -f "$WORK/src/config.json" ]; then
  rm -rf "$WORK/src"
  "$M" synth "$WORK/src" --format gptq --layers 21 --experts 64 --hidden 2048 --inter 1536 \
    --vocab 32000 --seed 3 --max-shard-size 2GB >/dev/null
fi
src_bytes=$(du -sb "$WORK/src" | awk '{print $1}')
cap_bytes=$((CAP_KIB * 1024))
echo "source: $src_bytes bytes; cap (RLIMIT_DATA): $cap_bytes bytes"
if [ "$src_bytes" -le $((cap_bytes * 2)) ]; then
  echo "memcap: FAIL: the source is not larger than twice the cap"
  exit 1
fi

# The largest MoE layer: its converted tensors' bytes, from the plan.
largest=$("$M" convert "$WORK/src" "$WORK/dst" --dry-run --json | python3 -c '
import json, sys, collections
p = json.load(sys.stdin)
per = collections.Counter()
for t in p["tensors"]:
    if t["action"] == "convert":
        per[t["name"].split(".experts.")[0]] += t["bytes"]
print(max(per.values()))')
bound=$((2 * largest + 256 * 1024 * 1024))

start=$(date +%s.%N)
out=$( (ulimit -d "$CAP_KIB" && exec "$M" convert "$WORK/src" "$WORK/dst" --json --threads 2) )
end=$(date +%s.%N)
anon=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_rss_anon_bytes"])')
file=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_rss_file_bytes"])')
printf 'convert under the cap: %.1f s, peak anonymous %d MiB, peak file-backed %d MiB; bound 2 x %d MiB + 256 MiB = %d MiB\n' \
  "$(echo "$end - $start" | bc)" $((anon >> 20)) $((file >> 20)) $((largest >> 20)) $((bound >> 20))
if [ "$anon" -gt "$bound" ]; then
  echo "memcap: FAIL: peak anonymous memory over the bound"
  exit 1
fi

# verify under the cap (issue 27): with and without the source on the CPU, and on the GPU where
# there is one; each reads through a window of the mapped shards (pages dropped after use), so its
# peak file-backed memory stays under a quarter of the checkpoint too.
dst_bytes=$(du -sb "$WORK/dst" | awk '{print $1}')
devices=cpu
if "$M" verify --help >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi -L >/dev/null 2>&1; then
  devices="cpu cuda"
fi
for d in $devices; do
  for with in "--source $WORK/src" ""; do
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    out=$( (ulimit -d "$CAP_KIB" && exec "$M" verify "$WORK/dst" $with --device "$d" --threads 2 \
      --tokens 8 --json) )
    end=$(date +%s.%N)
    file=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["run"]["peak_rss_file_bytes"])')
    anon=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["run"]["peak_rss_anon_bytes"])')
    printf 'verify %s--device %s under the cap: %.1f s, peak anonymous %d MiB, peak file-backed %d MiB (checkpoint %d MiB)\n' \
      "${with:+--source }" "$d" "$(echo "$end - $start" | bc)" $((anon >> 20)) $((file >> 20)) $((dst_bytes >> 20))
    if [ "$file" -gt $((dst_bytes / 4)) ]; then
      echo "memcap: FAIL: verify's peak file-backed memory is over a quarter of the checkpoint"
      exit 1
    fi
  done
done
echo "memcap: OK"
