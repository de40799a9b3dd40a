#!/usr/bin/env bash
# One device call: build with CUDA (sm_90a + portable sm_80), run every test (GPU tests run for
# real there), and the whole-model GPU verify benchmark. Logs under $OUT. Needs .devdeps/ (headers of CLI11,
# nlohmann_json, Eigen, googletest sources and ../shared), carried with the call: the device
# machine has no package registry.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
D=$PWD/.devdeps
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -2; g++ --version | head -1; cmake --version | head -1; nproc
} 2>&1 | tee "$OUT/env.txt"
cmake -S "$D/googletest" -B /tmp/gtb -G Ninja -DCMAKE_INSTALL_PREFIX=/tmp/gt -DBUILD_GMOCK=OFF >/dev/null &&
  ninja -C /tmp/gtb install >/dev/null || { echo "googletest build failed"; exit 1; }
cmake -S . -B build-gpu -G Ninja -DMOEPACK_CUDA=ON -DCMAKE_PREFIX_PATH="$D/usr;/tmp/gt" \
  -DMOEPACK_SHARED_DIR="$D/shared" 2>&1 | tail -3 | tee "$OUT/configure.txt"
cmake --build build-gpu -j 16 2>&1 | tail -5 | tee "$OUT/build.txt"
ctest --test-dir build-gpu -j 8 --output-on-failure 2>&1 | tee "$OUT/ctest.txt" | tail -15
build-gpu/bin/test_cuda_moe_runtime_cuda 2>&1 | tee "$OUT/cuda_tests.txt" | tail -8
cuobjdump --list-elf build-gpu/kernels/libmoepack_kernels.a 2>&1 | tee "$OUT/cuobjdump.txt" | head -5
# verify --device cuda of a >= 8 GB checkpoint against cat of its files.
OUT=$OUT bash bench/verify_gpu.sh build-gpu/bin/moepack /tmp/verify-bench 2>&1 | tail -8
# Conversion on the device's 16 cores: the cp -r ratio, then thread scaling with identical bytes.
MOEPACK=$PWD/build-gpu/bin/moepack bash bench/bench_convert.sh /tmp/bench 2>&1 | tee "$OUT/bench_convert.txt" | tail -6
for t in 1 4 16; do
  s=$(build-gpu/bin/moepack convert /tmp/bench/src /tmp/bench/t$t --threads $t --json |
      python3 -c "import json,sys; print(json.load(sys.stdin)['seconds'])")
  echo "threads=$t seconds=$s sha256=$(sha256sum /tmp/bench/t$t/model.safetensors | cut -c1-16)"
done 2>&1 | tee "$OUT/bench_threads.txt"
