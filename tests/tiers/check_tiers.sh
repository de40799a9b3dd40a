#!/usr/bin/env bash
# Folders are tiers (docs/architecture.md): each may include only the folders listed for it.
# Prints every upward or sideways include as FILE:LINE and exits 1 if there is one.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
declare -A allowed=(
  [core]="core"
  [io]="core io"
  [formats]="core formats"
  [kernels]="core formats kernels"
  [model]="core io formats model"
  [pipeline]="core io formats model pipeline"
  [verify]="core io formats kernels model pipeline verify"
  [synth]="core io formats synth"
  [tools]="core io formats kernels model pipeline verify synth tools"
)
bad=0
for tier in "${!allowed[@]}"; do
  [ -d "$root/$tier" ] || continue
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$rest")
    top=${inc%%/*}
    [ "$top" = "$inc" ] && continue  # a header beside the file
    if [[ " ${allowed[$tier]} " != *" $top "* ]]; then
      echo "${file#$root/}:$line: tier '$tier' includes '$inc' (allowed: ${allowed[$tier]})"
      bad=1
    fi
  done < <(grep -rn --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' \
             '^#include "' "$root/$tier" || true)
done
# An emptied lib/ left behind by an old checkout holds no code; a file in it does.
if [ -d "$root/lib" ] && [ -n "$(find "$root/lib" -type f -print -quit)" ]; then
  echo "lib/ holds files: every source belongs to a tier folder"
  bad=1
fi
if [ $bad = 0 ]; then echo "tiers: no upward include"; fi
exit $bad
