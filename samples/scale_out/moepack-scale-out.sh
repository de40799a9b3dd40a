#!/usr/bin/env bash
# Shard-parallel conversion on job engines people already run (docs/scale-out.md). moepack
# schedules nothing: each recipe maps the engine's task index to `convert --shard I/N`, and one
# `merge` runs after every task succeeded. DST and DST.parts/ must be on storage every task sees.
#
#   moepack-scale-out.sh units    SRC DST N [-- convert flags]   the N units and their bytes (JSON)
#   moepack-scale-out.sh parallel SRC DST N [-j JOBS] [-- convert flags]
#        GNU parallel on this host: N tasks, JOBS at a time (default 2), then merge
#   moepack-scale-out.sh slurm    SRC DST N [-- convert flags]
#        sbatch --array=0-(N-1) (SLURM_ARRAY_TASK_ID -> --shard), then a merge job with
#        --dependency=afterok:<array>; prints "convert=<id> merge=<id>". Other sbatch options
#        come from sbatch's own environment (SBATCH_PARTITION, SBATCH_TIMELIMIT, ...).
#   moepack-scale-out.sh k8s      SRC DST N [--image IMG] [--pvc CLAIM] [--mount PATH]
#                                 [--name NAME] [-- convert flags]
#        prints a Kubernetes Indexed Job (JOB_COMPLETION_INDEX -> --shard) and the merge Job;
#        apply the first, `kubectl wait --for=condition=complete job/NAME-convert`, then apply
#        the second (Kubernetes Jobs have no dependencies).
#
# MOEPACK names the moepack binary (default: moepack on PATH). Re-running a recipe after a failed
# task is safe: complete parts are skipped, a killed task's temporary is ignored, and merge
# refuses (exit 3, naming the part) anything missing, unfinished, corrupted or from another plan.
set -euo pipefail

usage() {
  sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[ $# -ge 4 ] || usage
recipe=$1 src=$2 dst=$3 n=$4
shift 4
case $n in '' | *[!0-9]* | 0) echo "N must be a positive integer, got '$n'" >&2 && exit 2 ;; esac
MOEPACK=${MOEPACK:-moepack}
jobs=2 image=moepack:latest pvc=models mount=/models name=moepack
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    -j) jobs=$2 && shift 2 ;;
    --image) image=$2 && shift 2 ;;
    --pvc) pvc=$2 && shift 2 ;;
    --mount) mount=$2 && shift 2 ;;
    --name) name=$2 && shift 2 ;;
    *) echo "unknown option '$1'" >&2 && usage ;;
  esac
done
[ $# -gt 0 ] && shift  # the "--"
flags=("$@")

# One shell-quoted command line (for sbatch --wrap and the container's sh -c).
quoted() {
  local out="" a
  for a in "$@"; do out+="$(printf '%q' "$a") "; done
  printf '%s' "${out% }"
}

case $recipe in
  units)
    exec "$MOEPACK" convert "$src" "$dst" --shard "0/$n" --dry-run --json "${flags[@]}"
    ;;
  parallel)
    # --halt now,fail=1: stop at the first failed task (its exit code is moepack's); the parts
    # already written stay and are skipped when the recipe runs again.
    seq 0 $((n - 1)) | parallel --halt now,fail=1 -j "$jobs" \
      "$(quoted "$MOEPACK" convert "$src" "$dst") --shard {}/$n $(quoted "${flags[@]}")"
    exec "$MOEPACK" merge "$dst" --source "$src"
    ;;
  slurm)
    mkdir -p "$(dirname "$dst")"  # Slurm opens the --output files there before moepack runs
    convert_job=$(sbatch --parsable --job-name=moepack-convert --array=0-$((n - 1)) \
      --output="$dst.convert-%A_%a.log" \
      --wrap="$(quoted "$MOEPACK" convert "$src" "$dst") --shard \"\$SLURM_ARRAY_TASK_ID/$n\" $(quoted "${flags[@]}")")
    convert_job=${convert_job%%;*}
    merge_job=$(sbatch --parsable --job-name=moepack-merge --dependency="afterok:$convert_job" \
      --kill-on-invalid-dep=yes --output="$dst.merge-%j.log" \
      --wrap="$(quoted "$MOEPACK" merge "$dst" --source "$src")")
    echo "convert=$convert_job merge=${merge_job%%;*}"
    ;;
  k8s)
    convert_cmd="$(quoted moepack convert "$src" "$dst") --shard \"\$JOB_COMPLETION_INDEX/$n\" $(quoted "${flags[@]}")"
    merge_cmd="$(quoted moepack merge "$dst" --source "$src")"
    job() {  # name, completions (= parallelism), extra spec lines, command
      cat <<EOF
apiVersion: batch/v1
kind: Job
metadata:
  name: $1
  labels:
    app.kubernetes.io/name: moepack
spec:
  completions: $2
  parallelism: $2
$3  backoffLimit: 3
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: moepack
          image: $image
          command: ["sh", "-c"]
          args:
            - |
              $4
          volumeMounts:
            - name: models
              mountPath: $mount
      volumes:
        - name: models
          persistentVolumeClaim:
            claimName: $pvc
EOF
    }
    job "$name-convert" "$n" "  completionMode: Indexed
" "$convert_cmd"
    echo "---"
    job "$name-merge" 1 "" "$merge_cmd"
    ;;
  *) usage ;;
esac
