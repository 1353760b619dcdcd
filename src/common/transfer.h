// What crosses a pipeline's stage boundary and how long it takes over a link: the one
// definition the balancer's activation bytes (balance/problem.h), the simulators
// (balance/predict.h, `ppbench simulate`), the summary's slowest link and the pipeline's
// buffers agree on. Pure arithmetic, in common/ so that every layer above can use it.
#pragma once

namespace ppb {

/// Bytes of the message stage `k` of a pipeline sends per item: the hidden states of `batch`
/// sequences of `tokens` tokens ([batch, tokens, hidden] elements of `dtype_bytes` bytes each)
/// across a boundary, or, from the last stage (`last_stage`), the `batch` int32 token ids
/// returned to stage 0 (4 bytes each).
inline double boundary_message_bytes(bool last_stage, int batch, int tokens, double hidden, int dtype_bytes) {
  if (last_stage) return 4.0 * batch;  // int32 token ids
  return static_cast<double>(batch) * tokens * hidden * dtype_bytes;
}

/// ms to send `bytes` as one message over a link of `latency_s` (s) and `bandwidth_Bps`
/// (bytes/s; <= 0: latency only): 1e3 (latency + bytes / bandwidth), the simulators' transfer
/// model (Hockney's latency-bandwidth model).
inline double link_transfer_ms(double latency_s, double bandwidth_Bps, double bytes) {
  return 1e3 * (latency_s + (bandwidth_Bps > 0 ? bytes / bandwidth_Bps : 0.0));
}

}  // namespace ppb
