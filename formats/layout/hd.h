// MOEPACK_HD marks index helpers shared by the C++ codecs and the CUDA kernels (STYLE.md §5).
#pragma once

#if defined(__CUDACC__)
#define MOEPACK_HD __host__ __device__ __forceinline__
#else
#define MOEPACK_HD inline
#endif
