// memory_snapshot_reader: PyTorch memory snapshots (torch.cuda.memory._dump_snapshot, and what
// poolscope's snapshot_recorder writes) read back into a profiler::memory_snapshot.
//
//   poolscope::profiler::memory_snapshot s =
//       poolscope::analysis::read_memory_snapshot("snap.pickle");
//   for (const auto& seg : s.segments) { ... seg.blocks ... }
//
// Fields read (memory_snapshot.hpp has the format): every segment's address, total_size and
// blocks (each block's size and state; requested_size, address and frames where present; the
// blocks must tile the segment exactly: their sizes sum to total_size, and an address given
// must be the running sum); device, stream, segment_type, segment_pool_id, is_expandable and the
// size sums where present. device_traces where present: each entry's action, addr (device_free
// for oom), size, and stream, time_us and frames where present. Frames: name, filename, line.
// Other keys (compile_context, user_metadata, external_annotations, ...) are ignored, as are
// allocator settings that are not scalars. A file holding a list is read as segments alone, as
// PyTorch's tools do.
//
// Errors: a pickle that cannot be read throws pickle_error (byte offset); one that does not hold
// a snapshot throws snapshot_error naming the field, e.g.
// `snap.pickle: segments[3].blocks[1].size: expected an int >= 0, got str`; a file that cannot be
// opened throws runtime_error naming the path.
// Thread safety: reentrant. Cost: linear in the file; each distinct stack is stored once.
#pragma once

#include <string>
#include <string_view>

#include "poolscope/error.hpp"
#include "poolscope/profiler/memory_snapshot.hpp"

namespace poolscope::analysis {

/// A pickle that does not hold a memory snapshot: names the source and the field.
class snapshot_error : public runtime_error {
 public:
  snapshot_error(const std::string& source, const std::string& field, const std::string& what);
  /// The field at fault, as a path: "segments[3].blocks[1].size".
  [[nodiscard]] const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

/// True if `head` (a file's first bytes) starts like a pickle of protocol 2 or above.
[[nodiscard]] bool looks_like_pickle(std::string_view head) noexcept;

/// Reads the snapshot pickled in `bytes`; `source` names it in errors.
[[nodiscard]] profiler::memory_snapshot parse_memory_snapshot(
    std::string_view bytes, const std::string& source = "<bytes>");
/// Reads the snapshot file at `path`.
[[nodiscard]] profiler::memory_snapshot read_memory_snapshot(const std::string& path);

}  // namespace poolscope::analysis
