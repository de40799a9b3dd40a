#!/usr/bin/env bash
# The device calls (H100, 16 cores) behind bench/RESULTS.md. Logs under $OUT. Needs .devdeps/
# (headers of CLI11, nlohmann_json, Eigen, googletest sources and ../shared), carried with the
# call: the device machine has no package registry.
#
#   bash bench/gpu_run.sh test     build with CUDA (sm_90a + portable), every test (GPU tests for
#                                  real), each GPU test binary's own log, the fused Marlin kernel
#                                  benchmark (bench/bench_marlin_moe.py)
#   bash bench/gpu_run.sh convert  the conversion benchmark on the device's cores
#                                  (bench/bench_convert.sh: six paths, cp -r ratio, RSS, threads)
#   bash bench/gpu_run.sh verify   whole-model verify --device cuda against cat (bench/verify_gpu.sh)
# `convert` and `verify` reuse build-gpu/ from `test` when the machine is still warm, else build.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
D=${DEVDEPS:-$PWD/.devdeps}
what=${1:-test}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -2; g++ --version | head -1; cmake --version | head -1; nproc
} > "$OUT/env.txt" 2>&1
if [ ! -x build-gpu/bin/moepack ] || [ "$what" = test ]; then
  cmake -S "$D/googletest" -B /tmp/gtb -G Ninja -DCMAKE_INSTALL_PREFIX=/tmp/gt -DBUILD_GMOCK=OFF >/dev/null &&
    ninja -C /tmp/gtb install >/dev/null || { echo "googletest build failed"; exit 1; }
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEPACK_CUDA=ON \
    -DCMAKE_PREFIX_PATH="$D/usr;/tmp/gt" -DMOEPACK_SHARED_DIR="$D/shared" > "$OUT/configure.txt" 2>&1
  cmake --build build-gpu -j 16 > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
  tail -1 "$OUT/build.txt"
fi
case "$what" in
  test)
    ctest --test-dir build-gpu -j 16 -LE "vllm|memcap" --output-on-failure > "$OUT/ctest.txt" 2>&1
    tail -4 "$OUT/ctest.txt"
    for b in build-gpu/bin/test_cuda_*; do
      "$b" > "$OUT/$(basename "$b").txt" 2>&1
      echo "$(basename "$b"): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$(basename "$b").txt" | tr '\n' ' ')"
    done
    cuobjdump --list-elf build-gpu/kernels/libmoepack_kernels.a > "$OUT/cuobjdump.txt" 2>&1
    sort -u "$OUT/cuobjdump.txt" | grep -o 'sm_[0-9a]*' | sort -u | tr '\n' ' '; echo
    python3 bench/bench_marlin_moe.py --lib build-gpu/bin/libmoepack_marlin_moe_bench.so \
      --out "$OUT/bench_marlin_moe.md" > "$OUT/bench_marlin_moe.txt" 2>&1
    tail -12 "$OUT/bench_marlin_moe.txt"
    ;;
  convert)
    MOEPACK=$PWD/build-gpu/bin/moepack bash bench/bench_convert.sh /tmp/bench > "$OUT/bench_convert.md" 2>&1
    tail -60 "$OUT/bench_convert.md"
    ;;
  verify)
    OUT=$OUT bash bench/verify_gpu.sh build-gpu/bin/moepack /tmp/verify-bench 2>&1 | tail -12
    ;;
esac
