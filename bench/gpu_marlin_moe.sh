#!/usr/bin/env bash
# One device call for issue 12's fused Marlin MoE: build the kernel's test and benchmark library
# with CUDA, run the GPU test for real, then the kernel benchmark (bench/bench_marlin_moe.py, its
# invocation at its top). Logs under $OUT. DEVDEPS: the .devdeps folder (headers of CLI11,
# nlohmann_json, Eigen, googletest sources, ../shared); the device machine has no registry.
#   bash bench/gpu_marlin_moe.sh            (from the repository root, $OUT set by the device tool)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
D=${DEVDEPS:-$PWD/.devdeps}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  nvcc --version | tail -2; python3 -c "import torch; print('torch', torch.__version__)"; nproc
} 2>&1 | tee "$OUT/env.txt"
cmake -S "$D/googletest" -B /tmp/gtb -G Ninja -DCMAKE_INSTALL_PREFIX=/tmp/gt -DBUILD_GMOCK=OFF >/dev/null &&
  ninja -C /tmp/gtb install >/dev/null || { echo "googletest build failed"; exit 1; }
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEPACK_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$D/usr;/tmp/gt" -DMOEPACK_SHARED_DIR="$D/shared" 2>&1 | tail -2 | tee "$OUT/configure.txt"
cmake --build build-gpu -j 16 --target test_cuda_marlin_moe_cuda moepack_marlin_moe_bench \
  > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
tail -2 "$OUT/build.txt"
cuobjdump --dump-resource-usage build-gpu/bin/libmoepack_marlin_moe_bench.so 2>&1 |
  grep -E "Function|REG|STACK" | head -60 > "$OUT/resource_usage.txt"
build-gpu/bin/test_cuda_marlin_moe_cuda 2>&1 | tee "$OUT/test_marlin_moe.txt" | tail -25
python3 bench/bench_marlin_moe.py --lib build-gpu/bin/libmoepack_marlin_moe_bench.so \
  --out "$OUT/bench_marlin_moe.md" --profile "$OUT/bench_marlin_moe_profile.txt" 2>&1 | tee "$OUT/bench_marlin_moe.txt" | tail -12
