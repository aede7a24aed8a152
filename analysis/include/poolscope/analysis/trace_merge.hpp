// trace_merge: the traces of the ranks of one launch (`mpirun -np N ... --trace t.json` writes
// t.rank0.json, t.rank1.json, ...) joined into one Chrome trace, one timeline: what `poolscope
// trace merge -o merged.json t.rank*.json` writes.
//
//   auto r = poolscope::analysis::merge_traces({"t.rank0.json", "t.rank1.json"}, "t.json");
//   std::cout << r.to_text();   // ranks, events, flows, the clocks' estimated skew
//
// The merged trace (docs/trace.md, "Merged traces"):
// - a process per rank, pid rank_pid(rank), named "rank R: <host> (pid P), <devices>"; in it the
//   rank's host threads keep their tids and every other track of the rank's trace (a CUDA
//   device's streams, its CUDA memory track) becomes a thread named after its device and stream;
//   counters of a device keep their values under "<device>: <counter>";
// - times on rank 0's clock: each rank's clock offset is estimated from the samples its trace
//   holds (distributedInfo.clock_sync, taken around barriers every rank passed: see
//   profiler/distributed_info.hpp) and interpolated linearly between the first and last sync, so
//   two clocks that drift apart stay aligned. A rank on rank 0's host shares its clock
//   (CLOCK_MONOTONIC is the kernel's): it is not shifted, its measured offset is only reported
//   (the barriers' own spread, a check on the method). A rank without samples is taken as on
//   rank 0's clock;
// - flow and async ids made unique across ranks (id * ranks + rank);
// - flows (cat "darray.piece") from each reshard piece's send ("darray.send" slices with args
//   src_device and dst_device) to its receive on the other rank ("darray.receive"), the k-th send
//   from device s to device d joined to the k-th receive of that pair (each device's transfer
//   queue runs its pieces in the plan's order, the same on every rank);
// - otherData: "merged": {ranks, files, the clock alignment of each rank (offset and its
//   uncertainty at each sync, in ns), the largest skew and uncertainty, flows joined and
//   transfers left unjoined}; the top-level "distributedInfo" is rank 0's with "merged": true.
//
// Ownership: results are plain values. Thread safety: reentrant. Cost: two streamed passes over
// each input; memory grows with the tracks, the send/receive slices and the names, not the events.
// Errors: invalid_argument for no input, an input named twice, the output among the inputs, two
// inputs of one rank, ranks that disagree on the launch's size or their clock samples; those of
// read_trace (runtime_error: a file that cannot be read or parsed) and trace_writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "poolscope/profiler/distributed_info.hpp"

namespace poolscope::analysis {

/// Rank r's process in a merged trace has pid rank_pid_base + r: far above the pids of one
/// rank's trace (1 for the host, 100 + d for CUDA device d), so a pid says which rank it is.
inline constexpr std::int64_t rank_pid_base = 1'000'000;
[[nodiscard]] constexpr std::int64_t rank_pid(int rank) noexcept {
  return rank_pid_base + rank;
}
/// The rank whose process `pid` is in a merged trace; nullopt for any other pid.
[[nodiscard]] std::optional<int> rank_of_pid(std::int64_t pid) noexcept;

/// A rank's clock against the reference's at one sync: there, local = reference + offset_ns,
/// within ± uncertainty_ns.
struct clock_offset {
  std::string label;                ///< the sync's ("start", "end")
  std::int64_t at_ns = 0;           ///< the rank's clock at the sync (its last round's exit)
  std::int64_t offset_ns = 0;       ///< the estimate: the middle of the bound
  std::int64_t uncertainty_ns = 0;  ///< half the bound's width
  /// Whether every round's bound agreed (they intersect); if not (a clock stepped during the
  /// sync), the narrowest round's bound is taken alone.
  bool consistent = true;
  /// The rank runs on the reference's host, so the two read one clock: the merge aligns it by 0
  /// and offset_ns is what the samples measured.
  bool same_host = false;
};

/// Estimates the offset of `rank`'s clock from `reference`'s over barriers both passed in the
/// same order (round k of one is round k of the other). Each round bounds it: the last rank to
/// enter a barrier does so before anyone leaves, so offset lies in [before_rank - after_ref,
/// after_rank - before_ref]; the rounds' bounds are intersected. Throws invalid_argument if the
/// two have different numbers of rounds, none, or a round that leaves before it enters.
[[nodiscard]] clock_offset estimate_clock_offset(
    std::span<const profiler::clock_sync_round> reference,
    std::span<const profiler::clock_sync_round> rank);

/// What merge_traces did with one input.
struct merged_rank {
  int rank = 0;
  std::string file;
  std::string name;  ///< its process's name in the merged trace
  std::string host;
  std::vector<std::string> devices;
  std::uint64_t events = 0;         ///< events taken from it (its metadata renamed, not counted)
  std::vector<clock_offset> syncs;  ///< against rank 0; empty: no samples (offset 0)
};

/// What merge_traces wrote.
struct merge_result {
  std::string output;
  int world_size = 0;
  std::vector<merged_rank> ranks;  ///< by rank
  std::uint64_t events = 0;        ///< events written, metadata and flows included
  std::uint64_t flows = 0;         ///< piece flows from a send to its receive
  /// Sends and receives between ranks left without a flow: their other end is in no input, or
  /// the aligned receive ends before its send began (the skew exceeded the transfer's length).
  std::uint64_t unmatched_transfers = 0;
  /// Of unmatched_transfers, the sends and receives paired in order whose aligned receive ends
  /// before the send began: clocks off by more than the transfer's length (or slices that are not
  /// the transfer's time), where the rest have no other end in any input.
  std::uint64_t reversed_transfers = 0;
  /// Sends and receives paired in order whose aligned receive ends before the send began by no
  /// more than the errors of their times: the two slices' clock errors (args.clock_error_ns: a
  /// GPU span's times come through a clock anchor known to within some microseconds) and the
  /// uncertainty of each rank's alignment to the reference clock (ranks of other hosts). Their
  /// order cannot be told, so they count as joined (not in unmatched_transfers), but have no
  /// flow (an arrow cannot go back in time, and each end must lie inside its slice).
  std::uint64_t pairs_within_clock_error = 0;
  /// The largest |offset| of any rank at any sync, and the largest uncertainty of an offset the
  /// merge applied (0 where every rank shares rank 0's host: nothing was shifted).
  std::int64_t max_skew_ns = 0;
  std::int64_t max_uncertainty_ns = 0;
  /// The largest |offset| measured between ranks that share a host (whose true offset is 0):
  /// how far barrier exits scatter there.
  std::int64_t max_same_host_offset_ns = 0;
  bool clocks_measured = false;  ///< whether every rank other than 0 had samples

  [[nodiscard]] std::string to_text() const;
  /// otherData.merged of the merged trace.
  [[nodiscard]] nlohmann::json to_json() const;
};

/// Merges the rank traces `inputs` (plain or gzip; any order) into `output` (".gz" compresses).
/// A trace without distributedInfo counts as the rank of its place in `inputs`. See the file
/// comment for the layout and the errors.
merge_result merge_traces(const std::vector<std::string>& inputs, const std::string& output);

}  // namespace poolscope::analysis
