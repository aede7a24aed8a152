// Internal state of stream_pool_allocator: per-stream state, the shared cache of whole upstream
// blocks, and the per-stream upstream adaptor the inner pools allocate from.
// Locking (see the class comment of stream_pool_allocator): a stream_state's members are guarded
// by its mutex; shared_cache's by its own; a stream's mutex may be held while taking the shared
// cache's, never the other way round.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "poolscope/pool/allocator.hpp"
#include "poolscope/pool/resource.hpp"
#include "poolscope/pool/stream_pool_allocator.hpp"

namespace poolscope::pool::detail {

struct stream_state;

/// The event recorded on a stream when it released a batch of blocks. Shared by the blocks of
/// the batch; destroyed with the last of them. `complete` is guarded by the shared cache mutex.
struct release_event {
  release_event(stream_event_source* events, stream_event_source::handle h, bool done)
      : source(events), handle(h), complete(done) {}
  release_event(const release_event&) = delete;
  release_event& operator=(const release_event&) = delete;
  ~release_event() {
    if (source != nullptr && handle != 0) {
      source->destroy(handle);
    }
  }
  stream_event_source* source;  // null: nothing to destroy (marked complete by a barrier)
  stream_event_source::handle handle;
  bool complete;
};

/// A whole upstream block cached outside an inner pool.
struct cached_block {
  void* ptr = nullptr;
  stream_state* tag = nullptr;           // the stream that released it (last user)
  std::shared_ptr<release_event> event;  // null while in the stream's own local list
};

/// Cached whole blocks by size (the key is the block's true size).
using block_map = std::multimap<std::size_t, cached_block>;

/// A block handed to the user, as the stream pool knows it.
struct live_block {
  std::size_t requested = 0;
  std::size_t rounded = 0;
};

/// A block freed on a stream other than its own, waiting for that stream's event.
struct pending_free {
  void* ptr = nullptr;
  std::size_t requested = 0;
  std::size_t rounded = 0;  // what the inner pool took for it: counted as cached meanwhile
  std::size_t alignment = 0;
  stream_event_source::handle event = 0;  // 0: recording failed, wait for a barrier
};

class stream_upstream;

/// Everything the pool keeps for one stream. Guarded by `mutex` except `stream` (immutable).
struct stream_state {
  explicit stream_state(stream_view s) : stream(s) {}

  const stream_view stream;
  std::mutex mutex;
  std::unique_ptr<stream_upstream> upstream;  // destroyed after inner
  std::unique_ptr<allocator> inner;           // this stream's pool
  std::unordered_map<void*, live_block> live;
  std::vector<pending_free> pending;
  std::size_t pending_bytes = 0;  // sum of pending[i].rounded
  block_map local;  // whole blocks the inner pool gave back, still private to this stream
  std::size_t local_bytes = 0;
  /// Whole blocks the inner pool holds that are larger than it asked for.
  struct oversize_block {
    std::size_t size = 0;   // the block's true size
    std::size_t asked = 0;  // what the inner pool asked for (and knows it by)
  };
  std::unordered_map<void*, oversize_block> oversize;
  std::size_t oversize_tail = 0;  // sum of size - asked over `oversize`: held, counted as cached

  /// Records that whole block `p` of `size` bytes serves the inner pool's request for `asked`
  /// (nothing when they are equal). May throw std::bad_alloc, changing nothing.
  void note_oversize(void* p, std::size_t size, std::size_t asked) {
    if (size != asked) {
      oversize.emplace(p, oversize_block{size, asked});
      oversize_tail += size - asked;
    }
  }
};

/// Whole blocks released by stream pools, tagged with the releasing stream and its event.
struct shared_cache {
  std::mutex mutex;
  block_map blocks;
  std::size_t bytes = 0;
};

/// The resource an inner pool allocates from: whole blocks for one stream, served by the stream
/// pool (its own released blocks, the shared cache, then the real resource). Called only while
/// the stream's mutex is held (the inner pool is driven only under it).
class stream_upstream final : public resource {
 public:
  stream_upstream(stream_pool_allocator& owner, stream_state& state, resource& real)
      : owner_(&owner), state_(&state), real_(&real) {}

 private:
  void* do_try_allocate(stream_view /*stream*/, std::size_t bytes) override {
    return owner_->acquire_block_locked(*state_, bytes);
  }
  void do_deallocate(stream_view /*stream*/, void* ptr, std::size_t bytes) noexcept override {
    owner_->return_block_locked(*state_, ptr, bytes);
  }
  [[nodiscard]] int do_device() const noexcept override { return real_->device(); }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return real_->kind(); }
  [[nodiscard]] std::string do_name() const override { return real_->name() + "@stream"; }
  [[nodiscard]] bool do_stream_ordered() const noexcept override { return real_->stream_ordered(); }

  stream_pool_allocator* owner_;
  stream_state* state_;
  resource* real_;
};

}  // namespace poolscope::pool::detail
