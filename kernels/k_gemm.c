/* k_gemm.c — the one matrix product of the CUDA backend: y = x · wᵀ with
 * bf16 inputs, f32 accumulation and f32 output, through cuBLAS.
 *
 * Layout reasoning. kvbatch keeps everything row-major: a weight is
 * w[n_out][n_in] (GGUF's ne[0] = n_in is the fast dimension), activations are
 * x[n_tok][n_in] and y[n_tok][n_out]. cuBLAS is column-major, and a row-major
 * R×C array with row stride C is, byte for byte, the column-major C×R array
 * with leading dimension C. So cuBLAS sees
 *   W' = w as column-major n_in × n_out, ld n_in   (W' = wᵀ)
 *   X' = x as column-major n_in × n_tok, ld n_in   (X' = xᵀ)
 *   Y' = y as column-major n_out × n_tok, ld n_out (Y' = yᵀ)
 * and we want yᵀ = (x·wᵀ)ᵀ = w·xᵀ = W'ᵀ·X', i.e. C = op(A)·op(B) with
 * A = W' transposed (CUBLAS_OP_T, lda = n_in), B = X' as is (CUBLAS_OP_N,
 * ldb = n_in), m = n_out, n = n_tok, k = n_in, C = Y' (ldc = n_out).
 * The "TN" form is also the fast one for tensor cores (both operands
 * K-contiguous). */
#include "kernels/kernels.h"

#include <limits.h>

static cublasStatus_t gemm(cublasHandle_t h, float *y, const uint16_t *x, const uint16_t *w, int64_t n_tok,
                           int64_t n_in, int64_t n_out, float beta)
{
    if (n_tok < 0 || n_in <= 0 || n_out <= 0 || n_tok > INT_MAX || n_in > INT_MAX || n_out > INT_MAX)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (n_tok == 0) return CUBLAS_STATUS_SUCCESS;
    const float alpha = 1.0f;
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)n_tok, (int)n_in, &alpha, w, CUDA_R_16BF,
                        (int)n_in, x, CUDA_R_16BF, (int)n_in, &beta, y, CUDA_R_32F, (int)n_out, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t kcu_gemm_bf16(cublasHandle_t h, float *y, const uint16_t *x, const uint16_t *w, int64_t n_tok,
                             int64_t n_in, int64_t n_out)
{
    return gemm(h, y, x, w, n_tok, n_in, n_out, 0.0f);
}

/* beta = 1: cuBLAS adds the product to C in its epilogue, in f32 — the
 * residual add without a kernel of its own or a buffer between. */
cublasStatus_t kcu_gemm_bf16_acc(cublasHandle_t h, float *y, const uint16_t *x, const uint16_t *w, int64_t n_tok,
                                 int64_t n_in, int64_t n_out)
{
    return gemm(h, y, x, w, n_tok, n_in, n_out, 1.0f);
}

/* The same layout with f32 operands. CUBLAS_COMPUTE_32F under the handle's
 * default math mode keeps f32 products (no TF32): the router's logits. */
cublasStatus_t kcu_gemm_f32(cublasHandle_t h, float *y, const float *x, const float *w, int64_t n_tok, int64_t n_in,
                            int64_t n_out)
{
    if (n_tok < 0 || n_in <= 0 || n_out <= 0 || n_tok > INT_MAX || n_in > INT_MAX || n_out > INT_MAX)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (n_tok == 0) return CUBLAS_STATUS_SUCCESS;
    const float alpha = 1.0f, beta = 0.0f;
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)n_tok, (int)n_in, &alpha, w, CUDA_R_32F,
                        (int)n_in, x, CUDA_R_32F, (int)n_in, &beta, y, CUDA_R_32F, (int)n_out, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
}
