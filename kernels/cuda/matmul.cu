// Matmuls through cuBLASLt, with the bias and GELU epilogues fused, and the
// descriptors, layouts and chosen algorithm cached per shape.
//
// Row-major ↔ column-major. cuBLASLt is column-major; a row-major (R, C) matrix is the
// same memory as a column-major (C, R) one, i.e. its transpose. With the nn.Linear
// layout W (OC, C), row-major:
//   forward   out(N,OC) = inp(N,C)·Wᵀ      ⇔  outᶜ(OC,N)  = Wᶜ(C,OC)ᵀ · inpᶜ(C,N)
//             transa = T, transb = N, m = OC, n = N, k = C, lda = ldb = C, ldd = OC;
//             the bias (OC) runs along m, as cuBLASLt's BIAS epilogue broadcasts it.
//   dinp      dinp(N,C) = dout(N,OC)·W     ⇔  dinpᶜ(C,N)  = Wᶜ(C,OC) · doutᶜ(OC,N)
//             transa = N, transb = N, m = C, n = N, k = OC, lda = C, ldb = OC, ldd = C
//   dweight   dW(OC,C) += dout(N,OC)ᵀ·inp  ⇔  dWᶜ(C,OC) += inpᶜ(C,N) · doutᶜ(OC,N)ᵀ
//             transa = N, transb = T, m = C, n = OC, k = N, lda = C, ldb = OC, ldd = C,
//             beta = 1 with C = D (accumulation), D fp32 even when A, B are bf16.
// bf16 runs: A, B bf16, fp32 compute and scale. fp32 runs: everything fp32 with
// CUBLAS_COMPUTE_32F (no TF32), the exact verification mode.
// GELU: the forward uses GELU_AUX(_BIAS), which also stores the pre-activation (aux).
// The backward of the matmul that *consumes* GELU's output (the MLP's c_proj) writes
// dinp through the DGELU epilogue: dinp = (dout·W) ∘ GELU'(aux = dinp_gelu_pre).
// In fp32 runs, or where cuBLASLt has no fused algorithm, the same results come from the
// plain GEMM followed by the elementwise GELU kernels (gelu.cu).
// Sizes: m, n, k are int (N < 2^31 rows); matrices may hold more than 2^31 elements
// (cuBLASLt's layouts are 64-bit; tests/cuda/test_cuda_int64.cu checks N·4C > 2^31).
// Tuning (Matmul::tune, on in bf16 training): the heuristic's first candidates are timed
// in place, during the run's first calls of each shape. Timing a candidate alone, on warm
// operands before the run, was tried (BENCHMARKS.md, fifth session) and picked
// algorithms that were slower inside the step for three of the ten shapes.
#include <algorithm>
#include <climits>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm_tuning.h"
#include "src/cuda/device_context.h"

namespace flashgpt::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    default: fail("matmul: unsupported dtype ", dtype_name(t));
  }
}

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The GELU epilogues are used for bf16 outputs. fp32 is the verification mode, and the
// precision of cuBLASLt's epilogue GELU (tanh) is not documented: there the GEMM runs
// with the plain (bias) epilogue and our exact elementwise GELU kernels follow.
bool fuse_gelu(DType out) { return out == DType::bf16; }

// Largest power of two (≤ 256) dividing the address: part of the cache key, since the
// algorithm chosen for aligned pointers may not run on less aligned ones.
int alignment(const void* p) {
  if (!p) return 256;
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 1;
  while (al < 256 && a % (2 * al) == 0) al *= 2;
  return al;
}

}  // namespace

// The in-place timing of a plan's candidates. Each call takes the candidate launched the
// fewest times so far, between two events; the events are read at later calls once they
// have completed (never waited for). A candidate's first call is not counted (it may
// include loading its kernel); once each has kTimedRuns more, the lowest median wins.
struct Matmul::Tuning {
  static constexpr int kCandidates = 8, kTimedRuns = 2;
  struct Trial {
    int cand;
    cudaEvent_t start, stop;
  };
  std::vector<cublasLtMatmulAlgo_t> cands;
  std::vector<int> launched;
  std::vector<std::vector<float>> ms;
  std::deque<Trial> trials;  // launched, not yet read

  ~Tuning() {
    for (const Trial& t : trials) cudaEventDestroy(t.start), cudaEventDestroy(t.stop);
  }
  // Reads the trials that have finished, oldest first.
  void harvest() {
    while (!trials.empty()) {
      const Trial t = trials.front();
      const cudaError_t q = cudaEventQuery(t.stop);
      if (q == cudaErrorNotReady) break;
      CUDA_CHECK(q);
      float x = 0.f;
      CUDA_CHECK(cudaEventElapsedTime(&x, t.start, t.stop));
      ms[size_t(t.cand)].push_back(x);
      CUDA_CHECK(cudaEventDestroy(t.start));
      CUDA_CHECK(cudaEventDestroy(t.stop));
      trials.pop_front();
    }
  }
  // The winner once every candidate has its timed runs, else -1 (gemm_tuning.h).
  int winner() const { return fastest_candidate(ms, kTimedRuns); }
  int next() const { return int(std::min_element(launched.begin(), launched.end()) - launched.begin()); }
};

struct Matmul::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  std::unique_ptr<Tuning> tuning;  // while the candidates are being timed
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Matmul::Matmul(DeviceContext& ctx) : ctx_(ctx) {}

Matmul::~Matmul() {
  for (auto& kv : plans_) delete kv.second;
}

size_t Matmul::plans_tuning() const {
  size_t n = 0;
  for (const auto& kv : plans_) n += kv.second->tuning != nullptr;
  return n;
}

bool Matmul::run(const Gemm& g, cudaStream_t stream, bool allow_fail) {
  FG_ASSERT(g.m > 0 && g.n > 0 && g.k > 0, "gemm sizes ", g.m, "x", g.n, "x", g.k);
  bool has_bias = g.epilogue == Epilogue::bias || g.epilogue == Epilogue::gelu_aux_bias;
  bool has_aux = g.epilogue == Epilogue::gelu_aux || g.epilogue == Epilogue::gelu_aux_bias ||
                 g.epilogue == Epilogue::dgelu;
  FG_ASSERT(!has_bias || g.bias, "bias epilogue without a bias pointer");
  FG_ASSERT(!has_aux || g.aux, "gelu_aux epilogue without an aux pointer");
  int al_a = alignment(g.A), al_b = alignment(g.B), al_d = alignment(g.D);
  int al_e = std::min(alignment(has_bias ? g.bias : nullptr), alignment(has_aux ? g.aux : nullptr));
  std::string key = cat(g.trans_a, g.trans_b, ' ', g.m, ' ', g.n, ' ', g.k, ' ', g.lda, ' ', g.ldb,
                        ' ', g.ldd, ' ', int(g.a_type), int(g.b_type), int(g.d_type), ' ',
                        int(g.epilogue), ' ', g.beta != 0.f, ' ', al_a, ' ', al_b, ' ', al_d, ' ', al_e);
  auto it = plans_.find(key);
  Plan* plan;
  if (it != plans_.end()) {
    plan = it->second;
  } else {
    plan = new Plan;
    plans_[key] = plan;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F));
    cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtEpilogue_t epi = lt_epilogue(g.epilogue);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (has_bias) {
      cudaDataType_t bt = cuda_type(g.d_type);
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (has_aux) {
      int64_t ld_aux = g.m;  // aux (m, n) column-major, like D with ldd = m
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof ld_aux));
    }
    // Layouts describe the matrices as stored: op(A) is m×k, so A is k×m when transposed.
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, cuda_type(g.a_type), g.trans_a ? g.k : g.m,
                                            g.trans_a ? g.m : g.k, g.lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, cuda_type(g.b_type), g.trans_b ? g.n : g.k,
                                            g.trans_b ? g.k : g.n, g.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, cuda_type(g.d_type), g.m, g.n, g.ldd));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = ctx_.workspace_bytes();
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t aa = uint32_t(al_a), ab = uint32_t(al_b), ad = uint32_t(al_d);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad));
    const bool tune = tune_ && g.a_type == DType::bf16 && g.b_type == DType::bf16;
    cublasLtMatmulHeuristicResult_t results[Tuning::kCandidates]{};
    int count = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx_.cublaslt(), plan->op, plan->a, plan->b, plan->d, plan->d,
                                                       pref, tune ? Tuning::kCandidates : 1, results, &count);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (st == CUBLAS_STATUS_SUCCESS && count > 0) {
      plan->algo = results[0].algo;
      plan->found = true;
      if (count > 1) {
        auto t = std::make_unique<Tuning>();
        for (int i = 0; i < count; ++i)
          if (results[i].state == CUBLAS_STATUS_SUCCESS) t->cands.push_back(results[i].algo);
        t->launched.assign(t->cands.size(), 0);
        t->ms.resize(t->cands.size());
        if (t->cands.size() > 1) plan->tuning = std::move(t);
      }
    } else if (!allow_fail && st != CUBLAS_STATUS_NOT_SUPPORTED) {
      CUBLAS_CHECK(st);  // a real error (not just "no algorithm for this combination")
    }
  }
  if (!plan->found) {
    if (allow_fail) return false;
    fail("cuBLASLt has no algorithm for gemm ", key);
  }
  if (has_bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  if (has_aux)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
  Tuning* t = plan->tuning.get();
  if (t) {
    t->harvest();
    const int best = t->winner();
    if (best >= 0) {
      plan->algo = t->cands[size_t(best)];
      plan->tuning.reset();
      t = nullptr;
    }
  }
  const int cand = t ? t->next() : -1;
  Tuning::Trial trial{cand, nullptr, nullptr};
  if (t) {
    CUDA_CHECK(cudaEventCreate(&trial.start));
    CUDA_CHECK(cudaEventCreate(&trial.stop));
    CUDA_CHECK(cudaEventRecord(trial.start, stream));
  }
  CUBLAS_CHECK(cublasLtMatmul(ctx_.cublaslt(), plan->op, &g.alpha, g.A, plan->a, g.B, plan->b,
                              &g.beta, g.D, plan->d, g.D, plan->d, t ? &t->cands[size_t(cand)] : &plan->algo,
                              ctx_.workspace(), ctx_.workspace_bytes(), stream));
  if (t) {
    CUDA_CHECK(cudaEventRecord(trial.stop, stream));
    t->trials.push_back(trial);
    ++t->launched[size_t(cand)];
  }
  return true;
}

void Matmul::forward(const MatmulForward& a, cudaStream_t stream) {
  FG_ASSERT(a.inp.defined() && a.weight.defined() && a.out.defined(), "matmul_forward tensors");
  int C = int(a.weight.shape[1]), OC = int(a.weight.shape[0]);
  int64_t N = a.inp.numel() / C;
  FG_ASSERT(N <= INT_MAX, "matmul rows N = ", N, " exceed cuBLAS's int dimensions");
  FG_ASSERT(a.weight.ndim == 2 && a.inp.numel() == N * C && a.out.numel() == N * OC,
            "matmul_forward shapes: inp ", a.inp.shape_str(), " weight ", a.weight.shape_str(),
            " out ", a.out.shape_str());
  FG_ASSERT(a.inp.dtype == a.weight.dtype && a.out.dtype == a.weight.dtype, "matmul dtypes differ");
  FG_ASSERT(N <= INT32_MAX, "matmul: N = ", N, " rows; cuBLASLt takes m, n, k as int");
  FG_ASSERT(!a.bias.defined() || (a.bias.numel() == OC && a.bias.dtype == a.out.dtype), "bias (OC)");
  FG_ASSERT(!a.gelu || !a.pre_gelu.defined() || a.pre_gelu.numel() == N * OC, "pre_gelu (N, OC)");
  Gemm g;
  g.trans_a = true; g.trans_b = false;
  g.m = OC; g.n = int(N); g.k = C;
  g.A = a.weight.data; g.lda = C; g.a_type = a.weight.dtype;
  g.B = a.inp.data; g.ldb = C; g.b_type = a.inp.dtype;
  g.D = a.out.data; g.ldd = OC; g.d_type = a.out.dtype;
  g.bias = a.bias.defined() ? a.bias.data : nullptr;
  if (a.gelu) {
    FG_ASSERT(a.pre_gelu.defined(), "matmul_forward with gelu needs pre_gelu");
    if (fuse_gelu(a.out.dtype)) {
      g.epilogue = g.bias ? Epilogue::gelu_aux_bias : Epilogue::gelu_aux;
      g.aux = a.pre_gelu.data;
      if (run(g, stream, /*allow_fail=*/true)) return;
    }
    // No fused algorithm for this shape/type: bias GEMM into pre_gelu, then GELU.
    g.epilogue = g.bias ? Epilogue::bias : Epilogue::none;
    g.aux = nullptr;
    g.D = a.pre_gelu.data;
    run(g, stream);
    gelu_forward(a.out, a.pre_gelu, stream);
    return;
  }
  g.epilogue = g.bias ? Epilogue::bias : Epilogue::none;
  run(g, stream);
}

void Matmul::backward(const MatmulBackward& a, void* scratch, cudaStream_t stream) {
  int C = int(a.weight.shape[1]), OC = int(a.weight.shape[0]);
  int64_t N = a.inp.numel() / C;
  FG_ASSERT(N <= INT_MAX, "matmul rows N = ", N, " exceed cuBLAS's int dimensions");
  FG_ASSERT(a.weight.ndim == 2 && a.inp.numel() == N * C && a.dout.numel() == N * OC,
            "matmul_backward shapes: inp ", a.inp.shape_str(), " weight ", a.weight.shape_str(),
            " dout ", a.dout.shape_str());
  FG_ASSERT(!a.dweight.defined() || (a.dweight.dtype == DType::f32 && a.dweight.numel() == int64_t(OC) * C),
            "dweight (OC, C) fp32");
  FG_ASSERT(!a.dbias.defined() || (a.dbias.dtype == DType::f32 && a.dbias.numel() == OC), "dbias (OC) fp32");
  FG_ASSERT(!a.dinp.defined() || (a.dinp.numel() == N * C && a.dinp.dtype == a.inp.dtype), "dinp (N, C)");
  FG_ASSERT(a.dout.dtype == a.inp.dtype && a.weight.dtype == a.inp.dtype, "matmul dtypes differ");
  FG_ASSERT(N <= INT32_MAX, "matmul: N = ", N, " rows; cuBLASLt takes m, n, k as int");
  if (a.dinp.defined()) {
    // dinpᶜ(C,N) = Wᶜ(C,OC) · doutᶜ(OC,N)  [∘ GELU'(dinp_gelu_pre)]
    Gemm g;
    g.trans_a = false; g.trans_b = false;
    g.m = C; g.n = int(N); g.k = OC;
    g.A = a.weight.data; g.lda = C; g.a_type = a.weight.dtype;
    g.B = a.dout.data; g.ldb = OC; g.b_type = a.dout.dtype;
    g.D = a.dinp.data; g.ldd = C; g.d_type = a.dinp.dtype;
    if (a.dinp_gelu_pre.defined()) {
      FG_ASSERT(a.dinp_gelu_pre.numel() == N * C && a.dinp_gelu_pre.dtype == a.dinp.dtype,
                "dinp_gelu_pre (N, C) of the activation dtype");
      g.epilogue = Epilogue::dgelu;
      g.aux = a.dinp_gelu_pre.data;
      if (!fuse_gelu(a.dinp.dtype) || !run(g, stream, /*allow_fail=*/true)) {
        g.epilogue = Epilogue::none;
        g.aux = nullptr;
        run(g, stream);
        gelu_backward(a.dinp, a.dinp_gelu_pre, a.dinp, stream);
      }
    } else {
      run(g, stream);
    }
  }
  if (a.dweight.defined()) {
    // dWᶜ(C,OC) += inpᶜ(C,N) · doutᶜ(OC,N)ᵀ
    Gemm g;
    g.trans_a = false; g.trans_b = true;
    g.m = C; g.n = OC; g.k = int(N);
    g.A = a.inp.data; g.lda = C; g.a_type = a.inp.dtype;
    g.B = a.dout.data; g.ldb = OC; g.b_type = a.dout.dtype;
    g.D = a.dweight.data; g.ldd = C; g.d_type = DType::f32;
    g.beta = 1.f;  // accumulate into dweight
    run(g, stream);
  }
  if (a.dbias.defined()) bias_grad(a.dbias, a.dout, scratch, stream);
}

}  // namespace flashgpt::cuda
