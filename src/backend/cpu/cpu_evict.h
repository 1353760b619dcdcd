// Evicting a block of host memory from every CPU cache, line by line (issue 47).
//
// Why: the profile times a unit cold, as it runs inside a stage whose weights exceed the cache,
// and used to "flush" by writing a buffer of 1.5x the last-level cache. Measured on this VM's
// 300 MiB L3 (Intel Xeon, 2026-12-06): a 32 MB block read right after that flush streamed at
// 29.7 GB/s, after clflushopt of its own lines at 15.8 GB/s, and a block not touched for 750 MB
// at 14.9 GB/s; 64 MB: 31.4, 15.2 and 14.9 GB/s. The L3's replacement keeps a block that was
// read again and again through a one-pass write stream, so the profile timed weights from the
// cache that a stage of many layers streams from memory: the step model's decode steps sat
// 1.2-1.5x under the pipeline's, and a tensor-parallel shard (half a layer) ran at cache speed
// (the TP2 decode profile 31-36% under the run's).
#pragma once

#include <cstddef>

namespace ppb::cpu {

/// Whether evict_lines can evict here (x86-64: clflushopt, else clflush; elsewhere false).
bool can_evict_lines();

/// Writes back and invalidates every cache line of [p, p + bytes) in every cache of the
/// coherence domain (clflushopt, or clflush without it), then fences. A no-op where
/// can_evict_lines() is false. Cost: about one memory write per dirty line; clean lines cost
/// little (a 61 MB layer: a few ms on this VM).
void evict_lines(const void* p, size_t bytes);

}  // namespace ppb::cpu
