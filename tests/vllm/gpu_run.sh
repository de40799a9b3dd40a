#!/usr/bin/env bash
# On a device machine: tests/vllm/gpu_run.sh DIR  (DIR made by gpu_prepare.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$1
tmp=$(mktemp -d)
gunzip -c "$dir/_moe_C_stable_libtorch.abi3.so.gz" >"$tmp/_moe_C_stable_libtorch.abi3.so"
(cd "$tmp" && sha256sum -c "$here/moe_c.sha256")
python3 "$here/gpu_marlin_kernel.py" "$tmp/_moe_C_stable_libtorch.abi3.so" "$dir/artifacts"
