// ppb_gpu_bench --nccl: NCCL send/recv and all-reduce between the first two GPUs of one process
// (issue 35 item 3), in nccl-tests' columns so the figures compare with theirs.
#pragma once

namespace ppb::bench {

/// Sweeps 8 B .. 256 MiB (x4 steps) of (a) send/recv, each GPU sending to the other at once
/// (nccl-tests' sendrecv_perf with two ranks), and (b) an in-place float sum all-reduce
/// (all_reduce_perf), over ncclCommInitAll's two communicators, both GPUs' calls in one
/// ncclGroupStart/End from this thread. Per size: `warmup` untimed calls, then `iters` timed
/// back to back between events on each GPU's stream; time = the slower GPU's / iters. Prints
/// one line per size starting with "nccl": operation, bytes, time (us), algbw = bytes / time
/// (GB/s), busbw (GB/s: all-reduce algbw x 2(n-1)/n, send/recv algbw, nccl-tests'
/// convention), and #wrong (elements that differ from the expected result of one checked call).
/// Returns 0, or 2 with a message on stderr where fewer than two GPUs are visible.
/// @throws ppb::InternalError on a failing CUDA or NCCL call.
int run_nccl_sweeps(int warmup, int iters);

}  // namespace ppb::bench
