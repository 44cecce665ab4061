// Programmatic dependent launch (sm_90): a kernel launched with launch_pdl may start while
// the kernel before it in the stream is still finishing, once every block of that one has
// called pdl_launch_dependents (or exited); it must call pdl_wait before it reads what that
// kernel wrote. Both are no-ops below sm_90 and for a kernel launched the ordinary way.
#pragma once
#include <cuda_runtime.h>
#include <utility>
#include "src/cuda/cuda_check.h"

namespace flashgpt::cuda::attn {

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the tail of the
// stream's previous kernel when `pdl`.
template <class... Params, class... Args>
void launch_pdl(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace flashgpt::cuda::attn
