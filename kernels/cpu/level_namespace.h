// The namespace of a CPU kernel compiled once per x86-64 level (CMakeLists.txt builds
// gemm_kernel.cpp and softmax_ce_kernel.cpp with FLASHGPT_GEMM_LEVEL = 2, 3 or 4 and
// -march=x86-64-vN -ffp-contract=off): v2 (SSE4.2), v3 (AVX2), v4 (AVX-512).
#pragma once

#if FLASHGPT_GEMM_LEVEL == 2
#define FLASHGPT_GEMM_NS v2
#elif FLASHGPT_GEMM_LEVEL == 3
#define FLASHGPT_GEMM_NS v3
#elif FLASHGPT_GEMM_LEVEL == 4
#define FLASHGPT_GEMM_NS v4
#else
#error "compile with FLASHGPT_GEMM_LEVEL 2, 3 or 4 (CMakeLists.txt)"
#endif
