// Check macros for CUDA, cuBLAS and NCCL calls, on top of common/check.h's PPB_CHECK_CALL: a
// failing call throws ppb::InternalError naming rank, host, file:line, the call's text and the
// library's error string (nccl-tests' CUDACHECK/NCCLCHECK, with exceptions instead of exit()).
//
// CUBLAS_CHECK and NCCL_CHECK only expand to library calls where used, so this header needs
// neither cublas_v2.h nor nccl.h; include those where the macros are used.
#pragma once

#include <cuda_runtime_api.h>

#include "common/check.h"

/// CUDA_CHECK(cudaMalloc(...)); after a kernel launch: CUDA_CHECK(cudaGetLastError()).
#define CUDA_CHECK(call)                                                                 \
  do {                                                                                   \
    const cudaError_t ppb_cuda_rc_ = (call);                                             \
    PPB_CHECK_CALL("CUDA", #call, ppb_cuda_rc_ == cudaSuccess,                           \
                   cudaGetErrorString(ppb_cuda_rc_));                                    \
  } while (0)

/// CUBLAS_CHECK(cublasGemmEx(...)).
#define CUBLAS_CHECK(call)                                                               \
  do {                                                                                   \
    const cublasStatus_t ppb_cublas_rc_ = (call);                                        \
    PPB_CHECK_CALL("cuBLAS", #call, ppb_cublas_rc_ == CUBLAS_STATUS_SUCCESS,             \
                   cublasGetStatusString(ppb_cublas_rc_));                               \
  } while (0)

/// NCCL_CHECK(ncclSend(...)).
#define NCCL_CHECK(call)                                                                 \
  do {                                                                                   \
    const ncclResult_t ppb_nccl_rc_ = (call);                                            \
    PPB_CHECK_CALL("NCCL", #call, ppb_nccl_rc_ == ncclSuccess,                           \
                   ncclGetErrorString(ppb_nccl_rc_));                                    \
  } while (0)
