// TMA descriptors for the Hopper attention kernels (host code): tensor_map_3d of
// flash_params.h, through the driver's cuTensorMapEncodeTiled, which the runtime finds
// for us (no link against libcuda).
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include "kernels/cuda/attention/flash_params.h"

namespace flashgpt::cuda::attn {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !f)
      fail("the Hopper attention kernels need cuTensorMapEncodeTiled, which the driver does not have");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

CUtensorMap tensor_map_3d(CUtensorMapDataType type, const void* base, const uint64_t dims[3],
                          const uint64_t strides[2], const uint32_t box[3], const char* what,
                          CUtensorMapSwizzle swizzle) {
  CUtensorMap map{};
  const cuuint64_t d[3] = {dims[0], dims[1], dims[2]};
  const cuuint64_t s[2] = {strides[0], strides[1]};
  const cuuint32_t b[3] = {box[0], box[1], box[2]};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode_tiled()(&map, type, 3, const_cast<void*>(base), d, s, b, elem_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail("cuTensorMapEncodeTiled failed (", int(r), ") for the ", what, " tensor of ", dims[0], " x ", dims[1], " x ",
         dims[2]);
  return map;
}

CUtensorMap bf16_rows_tensor_map(const __nv_bfloat16* base, int64_t row_stride, int T, int B, int rows,
                                 const char* what) {
  const uint64_t dims[3] = {uint64_t(row_stride), uint64_t(T), uint64_t(B)};
  const uint64_t strides[2] = {uint64_t(row_stride) * sizeof(__nv_bfloat16),
                               uint64_t(row_stride) * sizeof(__nv_bfloat16) * uint64_t(T)};
  const uint32_t box[3] = {uint32_t(kTmaBoxCols), uint32_t(rows), 1};
  return tensor_map_3d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, dims, strides, box, what);
}

}  // namespace flashgpt::cuda::attn
