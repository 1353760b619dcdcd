// Writes a RunRecord to an HDF5 results file (layout: results/README.md, DESIGN.md §4).
#pragma once

#include <string>

#include "results/run_record.h"

namespace ppb {

/// Version of the file layout, stored as the root attribute `format_version`.
inline constexpr int kResultsFormatVersion = 1;

/// Writes `run` to `path` atomically: everything goes to `path.tmp.<pid>` with root attribute
/// complete=0, then (if `complete`) complete=1 is set, the file is closed and renamed onto
/// `path`. The run writes a snapshot with complete=0 after each phase, so a run that dies keeps
/// its profile and the partitions already measured; a crash mid-write leaves the previous
/// snapshot, never a `path` that looks complete. In a snapshot the datasets that gain a row
/// per benchmark round (/benchmark/<name>/events and rep_*, /profile/latency_rounds_ms and
/// latency_rounds_after, /rounds/gap_s) are extendible, for append_results; in the complete
/// file they are stored as every other dataset. Costs O(everything the record holds).
/// @throws InternalError if HDF5 or the rename fails (the temporary file is removed).
void write_results(const std::string& path, const RunRecord& run, bool complete = true);

/// Rank 0, after a benchmark round: brings the snapshot at `path` up to date with `run` by
/// writing, in place, only what the file lacks, then flushes and closes it. `path` must hold a
/// snapshot of this same run (write_results(path, run', complete=false) of an earlier state of
/// `run`: same ppbench_version, created_utc and command_line, with the profile), possibly
/// appended to since. What it writes (results/README.md, "Snapshots"):
///   - for each partition with `measured`: the rows of /benchmark/<name>/events
///     [I, M, G+1, S, 6] and rep_wall_s, rep_tokens_per_s, rep_decode_tokens_per_s,
///     rep_ttft_p50_ms, rep_tpot_p50_ms, rep_round [I] that the file lacks (the rows it holds
///     are read from the file itself: an append after a whole write, or one with nothing new,
///     does the right thing). A group it creates (a partition first measured after the last
///     whole write) gets those datasets with write_results' attributes, and /validation/<name>
///     with validated = tokens_match = checksum_match = 0. Any partition of `run` missing from
///     /partitions (one that joined the rounds later) is written there, with the root's
///     partition_order. The summary (tokens_per_s, medians, stage_compute_ms and the other
///     attributes and datasets over all repetitions) is neither read from `run` nor rewritten:
///     the group's `snapshot` attribute says so and `summary_repetitions` how many repetitions
///     the summary present describes (0: none); the final write_results writes the normal
///     layout. (A whole write_results, complete or not, still needs the summary of each
///     measured partition: stage_compute_ms [S, 2], lane_cpu_s [S, 3], measured_stage_ms or
///     stage_workload_ms [S], and, where uniform is measured, metrics tokens_per_s and
///     decode_tokens_per_s of every measured partition.)
///   - /profile/latency_rounds_ms [K, R, U, 2] and latency_rounds_after [K], /rounds/gap_s
///     [rounds]: the rows the file lacks.
///   - root attributes status, elapsed_s, benchmark_rounds, round_profile_s.
/// Cost: O(rows appended + partitions): the rows the file holds are never read, copied or
/// rewritten. Exception: when `path` is readable but cannot be opened for writing (another
/// process has it open: HDF5 locks an open file, and an h5py session watching the run is
/// enough; or no write permission), the whole snapshot is rewritten as by write_results.
///
/// Not crash-safe as write_results is: the file is changed in place, not through a temporary
/// file and a rename. A process killed during the few milliseconds an append takes can leave
/// `path` inconsistent (HDF5 writes its metadata at flush and close, not atomically), even
/// unreadable, losing the earlier rounds too. Between appends the file is consistent: once
/// this returns, HDF5 has handed all data and metadata to the operating system (H5Fflush,
/// then H5Fclose), so a process killed later loses nothing; the OS writes them to disk in its
/// own time (no fsync, as write_results: a machine crash can lose recent rounds).
/// results/README.md ("Snapshots") gives what 600 kills inside appends left (no unreadable
/// file; a few partly applied appends, some datasets a row ahead) and why not SWMR.
/// @throws InternalError when `path` is missing, not HDF5, complete, or not a snapshot of this
///         run; when a dataset holds more rows than the record, rows of another shape, or
///         cannot grow (written complete, or by an older ppbench); or when HDF5 fails.
void append_results(const std::string& path, const RunRecord& run);

/// HDF5 library version "1.10.8".
std::string hdf5_version();

}  // namespace ppb
