// MOEPACK_HD marks index helpers shared by the C++ codecs and the CUDA kernels (STYLE.md §5).
#pragma once

#if defined(__CUDACC__)
#define MOEPACK_HD __host__ __device__ __forceinline__
// Fully unrolls the loop that follows in device code (a loop over a span of constant length, so
// that the span's array stays in registers); nothing on the host.
#define MOEPACK_UNROLL _Pragma("unroll")
#else
#define MOEPACK_HD inline
#define MOEPACK_UNROLL
#endif
