#!/usr/bin/env bash
# The Slurm recipe for real: starts a single-node Slurm (slurmctld + slurmd on localhost, from
# Debian's slurm-wlm; a minimal slurm.conf written here, auth/none so no munge key is needed),
# submits `moepack-scale-out.sh slurm` -- an sbatch --array of `convert --shard` tasks and a merge
# job depending on it -- waits for the merge job, and checks that the output is byte-identical to a
# single convert. Then resubmits the array: every task must find its part complete and skip it.
# Exit 77 (skipped) when Slurm is not installed; .ci/run installs it.
#
#   slurm_recipe.sh MOEPACK_BIN SOURCE_DIR
set -euo pipefail
bin=$(realpath "$1")
repo=$(realpath "$2")
for tool in slurmctld slurmd sbatch scontrol sinfo; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool not found (Debian: apt-get install slurmctld slurmd slurm-client)"
    exit 77
  fi
done
plugins=$(dirname "$(find /usr/lib /usr/lib64 -name auth_none.so -path '*slurm*' 2>/dev/null | head -1)" 2>/dev/null || true)
if [ -z "$plugins" ] || [ ! -f "$plugins/cred_none.so" ]; then
  echo "SKIP: this Slurm build has no auth/none + cred/none plugins"
  exit 77
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/moepack-slurm.XXXXXX")
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Ports from this process id, so that two runs on one machine do not collide.
base=$((20000 + ($$ % 2000) * 2))
host=$(hostname -s)
user=$(id -un)
cpus=$(nproc)
mkdir -p "$work/state" "$work/spool/moepack-node" "$work/log"
cat >"$work/slurm.conf" <<CONF
ClusterName=moepacktest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/none
CredType=cred/none
PluginDir=$plugins
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=moepack-node NodeAddr=127.0.0.1 NodeHostname=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=moepack-node Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$work/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" >"$work/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N moepack-node -f "$SLURM_CONF" >"$work/log/slurmd.out" 2>&1 &
pids+=($!)

fail() {
  echo "FAIL: $*"
  for f in "$work"/log/*; do
    echo "==== $f"
    tail -n 30 "$f"
  done
  for f in "$work"/data/*.log; do
    [ -f "$f" ] && echo "==== $f" && cat "$f"
  done
  exit 1
}
# Bounded waits (seconds of polling, not a timing assertion): daemons up, node idle.
for _ in $(seq 1 60); do
  state=$(sinfo -h -N -o '%t' 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 1
done
[ "${state:-}" = idle ] || fail "the Slurm node did not come up (state '${state:-}')"

# wait_job ID: until the job (every task of an array) has left the queue; prints its final states.
wait_job() {
  for _ in $(seq 1 180); do
    if ! squeue -h -j "$1" 2>/dev/null | grep -q .; then
      scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | sort -u
      return 0
    fi
    sleep 1
  done
  fail "job $1 did not finish"
}

data=$work/data
mkdir -p "$data"
"$bin" synth "$data/src" --format gptq --family qwen3 --layers 4 --experts 4 --hidden 256 \
  --inter 128 --seed 15 >/dev/null
flags=(--max-shard-size 200KB --threads 1)
"$bin" convert "$data/src" "$data/ref" "${flags[@]}" >/dev/null

recipe=$repo/samples/scale_out/moepack-scale-out.sh
ids=$(MOEPACK=$bin "$recipe" slurm "$data/src" "$data/dst" 3 -- "${flags[@]}") ||
  fail "sbatch refused the recipe's jobs"
echo "$ids"
convert_job=${ids#convert=}
convert_job=${convert_job%% *}
merge_job=${ids##*merge=}
states=$(wait_job "$merge_job")
[ "$states" = "JobState=COMPLETED" ] || fail "merge job $merge_job: $states"
states=$(wait_job "$convert_job")
[ "$states" = "JobState=COMPLETED" ] || fail "array job $convert_job: $states"
for i in 0 1 2; do
  [ -f "$data/dst.parts/$i-of-3/part.json" ] || fail "part $i-of-3 was not written"
done
diff -r "$data/ref" "$data/dst" || fail "merged output differs from a single convert"
echo "merged output is byte-identical to a single convert"

# A re-run of the whole array is idempotent: every task finds its part complete.
before=$(stat -c %Y "$data"/dst.parts/*/part.safetensors)
rm -rf "$data/dst"
ids=$(MOEPACK=$bin "$recipe" slurm "$data/src" "$data/dst" 3 -- "${flags[@]}")
echo "$ids"
convert_job=${ids#convert=}
convert_job=${convert_job%% *}
merge_job=${ids##*merge=}
states=$(wait_job "$merge_job")
[ "$states" = "JobState=COMPLETED" ] || fail "second merge job $merge_job: $states"
[ "$(stat -c %Y "$data"/dst.parts/*/part.safetensors)" = "$before" ] ||
  fail "a complete part was rewritten"
grep -l "already complete" "$data"/dst.convert-"$convert_job"_*.log | wc -l | grep -qx 3 ||
  fail "the second array's tasks did not all skip their parts"
diff -r "$data/ref" "$data/dst" || fail "second merge differs"
echo "PASS: Slurm array + dependent merge, idempotent re-run"
