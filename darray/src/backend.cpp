// The backend base class: argument checks, buffers and deferred frees, names, make_backend.
#include "poolscope/darray/backend.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/log.hpp"

namespace poolscope::darray {
namespace {
// When allocate() returns deferred buffers first: always for allocations of at least
// collect_small_below bytes, else once collect_after_count buffers or collect_after_bytes wait.
constexpr std::size_t collect_small_below = std::size_t{1} << 20;
constexpr std::size_t collect_after_count = 64;
constexpr std::size_t collect_after_bytes = std::size_t{64} << 20;
}  // namespace

std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
    case dtype::i32:
      return 4;
    case dtype::f64:
    case dtype::i64:
      return 8;
  }
  return 0;
}

std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return "float32";
    case dtype::f64:
      return "float64";
    case dtype::i32:
      return "int32";
    case dtype::i64:
      return "int64";
  }
  return "?";
}

std::string_view to_string(unary_op op) noexcept {
  switch (op) {
    case unary_op::neg:
      return "neg";
    case unary_op::abs:
      return "abs";
    case unary_op::exp:
      return "exp";
    case unary_op::log:
      return "log";
    case unary_op::sin:
      return "sin";
    case unary_op::cos:
      return "cos";
    case unary_op::sqrt:
      return "sqrt";
  }
  return "?";
}

std::string_view to_string(binary_op op) noexcept {
  switch (op) {
    case binary_op::add:
      return "add";
    case binary_op::sub:
      return "sub";
    case binary_op::mul:
      return "mul";
    case binary_op::div:
      return "div";
    case binary_op::maximum:
      return "maximum";
    case binary_op::minimum:
      return "minimum";
    case binary_op::pow:
      return "pow";
  }
  return "?";
}

std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return "sum";
    case reduce_op::prod:
      return "prod";
    case reduce_op::max:
      return "max";
    case reduce_op::min:
      return "min";
  }
  return "?";
}

std::string_view to_string(transport t) noexcept {
  switch (t) {
    case transport::automatic:
      return "auto";
    case transport::peer:
      return "peer";
    case transport::nccl:
      return "nccl";
  }
  return "?";
}

std::string_view to_string(rank_transport t) noexcept {
  switch (t) {
    case rank_transport::automatic:
      return "auto";
    case rank_transport::nccl:
      return "nccl";
    case rank_transport::mpi:
      return "mpi";
  }
  return "?";
}

rank_transport parse_rank_transport(std::string_view text) {
  for (const rank_transport t :
       {rank_transport::automatic, rank_transport::nccl, rank_transport::mpi}) {
    if (text == to_string(t)) {
      return t;
    }
  }
  throw invalid_argument("darray: between ranks '" + std::string(text) +
                         "' (expected auto, nccl or mpi)");
}

std::string describe_between_ranks(rank_transport t, std::size_t staging_chunk_bytes) {
  if (t != rank_transport::mpi) {
    return std::string(to_string(t));
  }
  return staging_chunk_bytes == 0 ? std::string("mpi in whole pieces")
                                  : "mpi in chunks of " + format_bytes(staging_chunk_bytes);
}

namespace {
template <typename T>
scalar identity_of(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return scalar::of(T{0});
    case reduce_op::prod:
      return scalar::of(T{1});
    case reduce_op::max:
      if constexpr (std::is_floating_point_v<T>) {
        return scalar{-std::numeric_limits<double>::infinity(), 0};
      } else {
        return scalar{static_cast<double>(std::numeric_limits<T>::lowest()),
                      std::numeric_limits<T>::lowest()};
      }
    case reduce_op::min:
      if constexpr (std::is_floating_point_v<T>) {
        return scalar{std::numeric_limits<double>::infinity(), 0};
      } else {
        return scalar{static_cast<double>(std::numeric_limits<T>::max()),
                      std::numeric_limits<T>::max()};
      }
  }
  return {};
}
}  // namespace

scalar identity(reduce_op op, dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return identity_of<float>(op);
    case dtype::f64:
      return identity_of<double>(op);
    case dtype::i32:
      return identity_of<std::int32_t>(op);
    case dtype::i64:
      return identity_of<std::int64_t>(op);
  }
  return {};
}

// --- view ---

std::int64_t view::size() const noexcept {
  std::int64_t n = 1;
  for (std::size_t i = 0; i < rank; ++i) {
    n *= extent[i];
  }
  return n;
}

namespace {
// view::of_box for the common case, every slice of both boxes of step 1 and `part` non-empty and
// inside `storage`: plain differences. Nullopt otherwise (the general path decides and checks).
std::optional<view> unit_step_view(void* base, const box& storage, const box& part) noexcept {
  if (storage.rank() != part.rank()) {
    return std::nullopt;
  }
  view v;
  v.base = base;
  v.rank = part.rank();
  std::int64_t dense_stride = 1;
  for (std::size_t i = v.rank; i-- > 0;) {
    const slice& w = storage.dims[i];
    const slice& p = part.dims[i];
    if (w.step != 1 || p.step != 1 || p.stop <= p.start || p.start < w.start || p.stop > w.stop) {
      return std::nullopt;
    }
    v.offset += dense_stride * (p.start - w.start);
    v.extent[i] = p.stop - p.start;
    v.stride[i] = dense_stride;
    dense_stride *= w.stop - w.start;
  }
  return v;
}
}  // namespace

view view::dense(void* base, const shape_t& extents) {
  if (extents.size() > max_rank) {
    throw invalid_argument("darray view: rank " + std::to_string(extents.size()) +
                           " exceeds the maximum rank " + std::to_string(max_rank));
  }
  view v;
  v.base = base;
  v.rank = extents.size();
  std::int64_t s = 1;
  for (std::size_t i = v.rank; i-- > 0;) {
    v.extent[i] = extents[i];
    v.stride[i] = s;
    s *= extents[i];
  }
  return v;
}

view view::of_box(void* base, const box& storage, const box& part) {
  if (const auto v = unit_step_view(base, storage, part)) {
    return *v;
  }
  const box local = local_slices(storage, part);  // throws unless part is inside storage
  view v;
  v.base = base;
  v.rank = local.rank();          // <= max_rank: a box holds no more
  std::int64_t dense_stride = 1;  // of storage's row-major layout, innermost axis first
  for (std::size_t i = v.rank; i-- > 0;) {
    v.offset += dense_stride * local.dims[i].start;
    v.extent[i] = local.dims[i].size();
    v.stride[i] = dense_stride * local.dims[i].step;
    dense_stride *= storage.dims[i].size();
  }
  return v;
}

bool view::contiguous() const noexcept {
  std::int64_t expect = 1;
  for (std::size_t i = rank; i-- > 0;) {
    if (extent[i] == 1) {
      continue;
    }
    if (stride[i] != expect) {
      return false;
    }
    expect *= extent[i];
  }
  return true;
}

// --- buffer ---

buffer::buffer(std::shared_ptr<backend> owner, int device, void* ptr, std::size_t bytes) noexcept
    : owner_(std::move(owner)), device_(device), ptr_(ptr), bytes_(bytes) {}

buffer::buffer(std::shared_ptr<backend> owner, int device, void* ptr, std::size_t bytes,
               std::vector<event> uses) noexcept
    : owner_(std::move(owner)), device_(device), ptr_(ptr), bytes_(bytes), uses_(std::move(uses)) {}

int buffer::device() const noexcept {
  return owner_->first_local_device() + device_;
}

buffer::~buffer() {
  owner_->defer_free(device_, ptr_, bytes_, std::move(uses_));
}

void buffer::add_use(const event& e) {
  if (e.empty()) {
    return;
  }
  const detail::event_state& added = *e.state();
  const std::lock_guard lock(uses_lock_);
  if (added.owner() != nullptr) {
    // One event per queue: the later one completes after the earlier.
    for (auto& u : uses_) {
      const detail::event_state& held = *u.state();
      if (held.owner() == added.owner() && held.queue_key() == added.queue_key()) {
        if (held.sequence() < added.sequence()) {
          u = e;
        }
        return;
      }
    }
  } else if (uses_.size() >= 16) {
    // Events of unknown order: keep the list short by dropping completed ones.
    std::erase_if(uses_, [](const event& u) { return u.ready(); });
  }
  uses_.push_back(e);
}

// --- backend ---

backend::backend()
    : id_([] {
        static std::atomic<std::uint64_t> made{0};
        return made.fetch_add(1, std::memory_order_relaxed) + 1;
      }()) {}

std::string backend::label() const {
  return name() + " #" + std::to_string(id_);
}

void backend::device_error(int device, const char* what) const {
  if (group_ && group_->size() > 1 && device >= 0 && device < device_count()) {
    throw invalid_argument(std::string("darray ") + what + ": device " + std::to_string(device) +
                           " is rank " + std::to_string(rank_of(device)) + "'s, not this " +
                           group_->describe() + "'s (devices " + std::to_string(first_local_) +
                           ".." + std::to_string(first_local_ + local_count_ - 1) + ")");
  }
  throw invalid_argument(std::string("darray ") + what + ": device " + std::to_string(device) +
                         " is not one of the " + std::to_string(device_count()) + " devices of " +
                         name());
}

std::string backend::name() const {
  if (group_ && group_->size() > 1) {
    return do_name() + " x " + std::to_string(group_->size()) + " ranks";
  }
  return do_name();
}

std::string backend::device_name(int device) const {
  if (device < 0 || device >= device_count()) {
    device_error(device, "device_name");
  }
  return device_names_[static_cast<std::size_t>(device)];
}

int backend::rank_of(int device) const {
  if (device < 0 || device >= device_count()) {
    device_error(device, "rank_of");
  }
  // The last rank whose first device is at or before `device` (ranks may hold no device).
  const auto after = std::upper_bound(first_of_rank_.begin(), first_of_rank_.end() - 1, device);
  return static_cast<int>(after - first_of_rank_.begin()) - 1;
}

int backend::first_device_of(int rank) const {
  if (rank < 0 || rank >= group_->size()) {
    throw invalid_argument("darray first_device_of: rank " + std::to_string(rank) +
                           " is not one of the " + std::to_string(group_->size()) + " ranks");
  }
  return first_of_rank_[static_cast<std::size_t>(rank)];
}

void backend::join_group(std::shared_ptr<process_group> group) {
  group_ = group ? std::move(group) : process_group::single();
  local_count_ = do_device_count();
  const auto counts = group_->size() > 1 && !group_->uses_mpi()
                          // An adopted NCCL communicator: one GPU per rank, its rank's number.
                          ? std::vector<std::int64_t>(static_cast<std::size_t>(group_->size()), 1)
                          : group_->all_gather(std::int64_t{local_count_});
  if (group_->size() > 1 && !group_->uses_mpi() && local_count_ != 1) {
    throw invalid_argument("darray backend over " + group_->describe() +
                           " adopted from an NCCL communicator: " + std::to_string(local_count_) +
                           " devices here, and such a group has one GPU per rank");
  }
  first_of_rank_.assign(1, 0);
  for (const std::int64_t c : counts) {
    first_of_rank_.push_back(first_of_rank_.back() + static_cast<int>(c));
  }
  first_local_ = first_of_rank_[static_cast<std::size_t>(group_->rank())];
  device_total_ = first_of_rank_.back();
  device_names_.clear();
  for (int d = 0; d < local_count_; ++d) {
    device_names_.push_back(do_device_name(d));
  }
  if (group_->size() > 1 && group_->uses_mpi()) {
    // One text per rank: its devices' names, each ended by a newline.
    std::string mine;
    for (const auto& n : device_names_) {
      mine += n + '\n';
    }
    device_names_.clear();
    for (const std::string& theirs : group_->all_gather(mine)) {
      for (std::size_t at = 0, end = 0; (end = theirs.find('\n', at)) != std::string::npos;
           at = end + 1) {
        device_names_.push_back(theirs.substr(at, end - at));
      }
    }
  } else if (group_->size() > 1) {
    device_names_.assign(static_cast<std::size_t>(device_total_), do_device_name(0));
  }
}

pool::allocator& backend::allocator(int device) {
  return do_allocator(local(device, "allocator"));
}

std::shared_ptr<buffer> backend::allocate(int device, std::size_t bytes) {
  return allocate_on(local(device, "allocate"), bytes);
}

std::shared_ptr<buffer> backend::allocate_on(int device, std::size_t bytes) {
  if (bytes == 0) {
    throw invalid_argument("darray allocate: 0 bytes requested on device " +
                           std::to_string(device));
  }
  // Returning deferred buffers may query events; a small allocation pays for that only when
  // enough is waiting (on a loop of small ops the queries cost more than the memory is worth).
  if (bytes >= collect_small_below ||
      deferred_count_.load(std::memory_order_relaxed) >=
          std::max(collect_after_count, collect_at_count_.load(std::memory_order_relaxed)) ||
      deferred_bytes_.load(std::memory_order_relaxed) >=
          std::max(collect_after_bytes, collect_at_bytes_.load(std::memory_order_relaxed))) {
    collect_deferred(false);
  }
  void* p = nullptr;
  try {
    p = do_allocator(device).allocate(do_alloc_stream(device), bytes);
  } catch (const out_of_memory&) {
    // Memory may be held by buffers waiting for their last use: wait for them and retry once.
    do_synchronize();
    collect_deferred(true);
    p = do_allocator(device).allocate(do_alloc_stream(device), bytes);
  }
  return std::make_shared<buffer>(shared_from_this(), device, p, bytes);
}

std::shared_ptr<buffer> backend::allocate(int device, std::size_t bytes, queue_kind first_use) {
  device = local(device, "allocate");
  if (bytes == 0 || deferred_count_.load(std::memory_order_relaxed) == 0) {
    return allocate_on(device, bytes);  // (which refuses 0 bytes)
  }
  // The uses of a buffer dropped with them pending on the queue of the new work come before it
  // in that queue's order: the memory can be written by the new work at once.
  const int key = queue_key(device, first_use);
  void* p = nullptr;
  std::vector<event> uses;
  {
    const std::lock_guard lock(state_mutex_);
    const std::size_t n = deferred_.size();
    for (std::size_t i = n; i > 0 && n - i < reuse_scan; --i) {
      deferred& d = deferred_[i - 1];
      if (d.queue == key && d.device == device && d.bytes == bytes) {
        p = d.ptr;
        uses = std::move(d.uses);
        deferred_.erase(deferred_.begin() + static_cast<std::ptrdiff_t>(i - 1));
        deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
        deferred_bytes_.store(deferred_bytes_.load(std::memory_order_relaxed) - bytes,
                              std::memory_order_relaxed);
        break;
      }
    }
  }
  if (p == nullptr) {
    return allocate_on(device, bytes);
  }
  try {
    // The uses still pending are all on the new work's queue: they stay the buffer's (the new
    // work's event takes their place in the list, which so needs no new room).
    auto b = std::make_shared<buffer>(shared_from_this(), device, p, bytes, std::move(uses));
    counters_.buffers_reused.fetch_add(1, std::memory_order_relaxed);
    return b;
  } catch (...) {
    defer_free(device, p, bytes, std::move(uses));  // back where it was (noexcept)
    throw;
  }
}

backend::queue_tracks& backend::tracks() {
  // An acquire load first: std::call_once itself costs a few hundred instructions (thread-local
  // bookkeeping and pthread_once) on every call, and tracks() runs several times per chunk op.
  if (tracks_ready_.load(std::memory_order_acquire)) {
    return tracks_;
  }
  std::call_once(tracks_once_, [this] {
    const auto n = static_cast<std::size_t>(do_device_count()) * 2;
    tracks_.track = std::make_unique<queue_track[]>(n);
    tracks_.waited = std::make_unique<std::atomic<std::uint64_t>[]>(n * n);
    for (std::size_t i = 0; i < n * n; ++i) {
      tracks_.waited[i].store(0, std::memory_order_relaxed);
    }
    tracks_.outgoing = std::make_unique<outgoing_copies[]>(n / 2);
    tracks_.queues = n;
    tracks_ready_.store(true, std::memory_order_release);
  });
  return tracks_;
}

void backend::note_outgoing_copy(int device, const event& end) noexcept {
  outgoing_copies& o = tracks().outgoing[static_cast<std::size_t>(device)];
  try {
    const std::lock_guard lock(o.mutex);
    // One end per queue: a newer record of a queue completes after its older ones.
    const int key = end.state()->queue_key();
    const auto same = std::find_if(o.ends.begin(), o.ends.end(),
                                   [key](const event& e) { return e.state()->queue_key() == key; });
    if (same != o.ends.end()) {
      *same = end;
    } else {
      o.ends.push_back(end);
    }
    o.any.store(true, std::memory_order_release);
  } catch (...) {  // no memory for the note: compute does not yield to this copy
  }
}

bool backend::yields_to_copies(int device, queue_kind q) noexcept {
  if (!yield_to_copies_ || q != queue_kind::compute) {
    return false;
  }
  outgoing_copies& o = tracks().outgoing[static_cast<std::size_t>(device)];
  if (!o.any.load(std::memory_order_acquire)) {
    return false;
  }
  const std::lock_guard lock(o.mutex);
  std::erase_if(o.ends, [this](const event& e) {
    try {
      return settled(e) || e.ready();
    } catch (...) {
      return true;  // a failed query: the copy's error surfaces where its event is waited for
    }
  });
  o.any.store(!o.ends.empty(), std::memory_order_release);
  if (o.ends.empty()) {
    return false;
  }
  counters_.compute_yielding.fetch_add(1, std::memory_order_relaxed);
  return true;
}

int backend::own_queue_key(const event& e) const noexcept {
  const detail::event_state* s = e.state();
  if (s == nullptr || s->owner() != this || s->queue_key() < 0 ||
      static_cast<std::size_t>(s->queue_key()) >= tracks_.queues) {
    return -1;
  }
  return s->queue_key();
}

event backend::record(int device, queue_kind q) {
  device = local(device, "record");
  queue_track& t = tracks().track[static_cast<std::size_t>(queue_key(device, q))];
  // Sequences follow the order of the records on the queue, also when threads record at once.
  const std::lock_guard lock(t.record_mutex);
  event e = do_record(device, q, t.recorded + 1);
  ++t.recorded;
  // (A load first: nearly every record follows no large copy, and then writes nothing.)
  if (t.copy_source.load(std::memory_order_relaxed) >= 0) {
    if (const int source = t.copy_source.exchange(-1, std::memory_order_relaxed); source >= 0) {
      note_outgoing_copy(source, e);
    }
  }
  return e;
}

namespace {
// a = max(a, v)
void raise_to(std::atomic<std::uint64_t>& a, std::uint64_t v) noexcept {
  std::uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v &&
         !a.compare_exchange_weak(cur, v, std::memory_order_release, std::memory_order_relaxed)) {
  }
}
}  // namespace

void backend::wait(int device, queue_kind q, const event& e) {
  device = local(device, "wait");
  if (e.empty()) {
    return;
  }
  queue_tracks& tr = tracks();
  const int source = own_queue_key(e);
  if (source < 0) {
    if (!e.ready()) {
      do_wait(device, q, e);
      counters_.waits.fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  const int self = queue_key(device, q);
  const std::uint64_t seq = e.state()->sequence();
  std::atomic<std::uint64_t>& waited =
      tr.waited[static_cast<std::size_t>(self) * tr.queues + static_cast<std::size_t>(source)];
  if (source == self ||
      seq <= tr.track[static_cast<std::size_t>(source)].complete.load(std::memory_order_acquire) ||
      seq <= waited.load(std::memory_order_acquire)) {
    // In order on its own queue, done, or the queue already waits for a later event of `source`.
    counters_.waits_elided.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  do_wait(device, q, e);
  // Published after the wait is enqueued: whoever skips a wait on this finds it in the queue.
  raise_to(waited, seq);
  counters_.waits.fetch_add(1, std::memory_order_relaxed);
}

void backend::synchronize() {
  // Every event recorded before the synchronization is complete after it.
  queue_tracks& tr = tracks();
  std::vector<std::uint64_t> recorded(tr.queues);
  for (std::size_t k = 0; k < tr.queues; ++k) {
    const std::lock_guard lock(tr.track[k].record_mutex);
    recorded[k] = tr.track[k].recorded;
  }
  do_synchronize();
  for (std::size_t k = 0; k < tr.queues; ++k) {
    raise_to(tr.track[k].complete, recorded[k]);
  }
  collect_deferred(true);
}

namespace {
void check_same_extents(const view& a, const view& b, const char* what) {
  bool same = a.rank == b.rank;
  for (std::size_t i = 0; same && i < a.rank; ++i) {
    same = a.extent[i] == b.extent[i];
  }
  if (!same) {
    auto str = [](const view& v) {
      std::string s = "(";
      for (std::size_t i = 0; i < v.rank; ++i) {
        s += (i ? ", " : "") + std::to_string(v.extent[i]);
      }
      return s + ")";
    };
    throw invalid_argument(std::string("darray ") + what + ": extents " + str(a) + " and " +
                           str(b) + " differ");
  }
}

void check_view(const view& v, const char* what) {
  if (v.rank > max_rank) {
    throw invalid_argument(std::string("darray ") + what + ": view rank " + std::to_string(v.rank) +
                           " exceeds " + std::to_string(max_rank));
  }
  if (v.base == nullptr && v.size() > 0) {
    throw invalid_argument(std::string("darray ") + what + ": view of " + std::to_string(v.size()) +
                           " elements has no memory");
  }
  for (std::size_t i = 0; i < v.rank; ++i) {
    if (v.extent[i] < 0 || v.stride[i] < 0) {
      throw invalid_argument(std::string("darray ") + what +
                             ": negative extent or stride on axis " + std::to_string(i));
    }
  }
}
}  // namespace

void backend::copy(int queue_device, queue_kind q, dtype t, const view& dst, int dst_device,
                   const view& src, int src_device, transport how) {
  if (queue_device != dst_device && queue_device != src_device) {
    throw invalid_argument("darray copy: queue device " + std::to_string(queue_device) +
                           " is neither the source " + std::to_string(src_device) +
                           " nor the destination " + std::to_string(dst_device));
  }
  dst_device = local(dst_device, "copy (destination)");
  src_device = local(src_device, "copy (source)");
  queue_device = local(queue_device, "copy (queue)");
  check_view(dst, "copy");
  check_view(src, "copy");
  check_same_extents(dst, src, "copy");
  if (dst.size() == 0) {
    return;
  }
  do_copy(queue_device, q, t, dst, dst_device, src, src_device, how);
  if (yield_to_copies_ && src_device != dst_device &&
      static_cast<std::uint64_t>(dst.size()) * size_of(t) >= yield_min_bytes) {
    tracks().track[static_cast<std::size_t>(queue_key(queue_device, q))].copy_source.store(
        src_device, std::memory_order_relaxed);
  }
}

void backend::copy_group(dtype t, const std::vector<transfer>& list, transport how) {
  std::vector<transfer> moving;
  std::vector<rank_transfer> between;
  moving.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    const transfer& x = list[i];
    if (x.dst_device == x.src_device) {
      throw invalid_argument("darray copy_group: transfer " + std::to_string(i) + " has device " +
                             std::to_string(x.src_device) +
                             " on both sides (a group moves between devices)");
    }
    if (is_local(x.src_device) != is_local(x.dst_device)) {
      // One side on another rank: this rank's side is a send or a receive.
      const bool sending = is_local(x.src_device);
      const view& mine = sending ? x.src : x.dst;
      const int peer = sending ? x.dst_device : x.src_device;
      rank_transfer y =
          between_ranks(sending ? x.src_device : x.dst_device, mine, peer, sending, "copy_group");
      if (mine.size() != 0) {
        between.push_back(std::move(y));
      }
      continue;
    }
    transfer y = x;
    y.dst_device = local(x.dst_device, "copy_group (destination)");
    y.src_device = local(x.src_device, "copy_group (source)");
    check_view(x.dst, "copy_group");
    check_view(x.src, "copy_group");
    check_same_extents(x.dst, x.src, "copy_group");
    if (x.dst.size() != 0) {
      moving.push_back(y);
    }
  }
  if (!moving.empty() || !between.empty()) {
    do_copy_group(t, moving, between, how);
  }
  for (const rank_transfer& x : between) {
    count_between_ranks(static_cast<std::uint64_t>(x.data.size()) * size_of(t));
  }
}

void backend::do_copy_group(dtype t, const std::vector<transfer>& list,
                            const std::vector<rank_transfer>& between, transport how) {
  copy_one_by_one(t, list, how == transport::nccl ? transport::peer : how);
  exchange_one_by_one(t, between);
}

void backend::copy_one_by_one(dtype t, const std::vector<transfer>& list, transport how) {
  for (const transfer& x : list) {
    do_copy(x.src_device, queue_kind::transfer, t, x.dst, x.dst_device, x.src, x.src_device, how);
  }
  // Each receiver's transfer queue after its senders' (one wait per link, in list order).
  std::vector<std::pair<int, int>> links;
  for (const transfer& x : list) {
    const std::pair<int, int> link{x.src_device, x.dst_device};
    if (std::find(links.begin(), links.end(), link) == links.end()) {
      links.push_back(link);
      wait(global_device(x.dst_device), queue_kind::transfer,
           record(global_device(x.src_device), queue_kind::transfer));
    }
  }
}

void backend::exchange_one_by_one(dtype t, const std::vector<rank_transfer>& between) {
  for (const rank_transfer& x : between) {
    if (x.sending) {
      do_send(x.device, t, x.data, x.peer_device, x.peer_rank, x.tag);
    } else {
      do_receive(x.device, t, x.data, x.peer_device, x.peer_rank, x.tag);
    }
  }
}

backend::rank_transfer backend::between_ranks(int device, const view& v, int peer_device,
                                              bool sending, const char* what) const {
  const int l = local(device, what);
  if (peer_device < 0 || peer_device >= device_count() || is_local(peer_device)) {
    throw invalid_argument(
        std::string("darray ") + what + ": peer device " + std::to_string(peer_device) +
        (is_local(peer_device)
             ? " is this process's (copy() moves within it)"
             : " is not one of the " + std::to_string(device_count()) + " devices of " + name()));
  }
  check_view(v, what);
  if (!v.contiguous()) {
    throw invalid_argument(std::string("darray ") + what +
                           ": a transfer between ranks needs a contiguous view (pack it first)");
  }
  const int peer_local = peer_device - first_device_of(rank_of(peer_device));
  // Messages between two devices carry the pair in their tag: each pair's messages are sent by
  // one queue and received by one queue, in the order of the plans, so they match in order.
  const int from = sending ? l : peer_local;
  const int to = sending ? peer_local : l;
  if (from >= max_devices_per_rank || to >= max_devices_per_rank) {
    throw invalid_argument(std::string("darray ") + what + ": a rank holds more than " +
                           std::to_string(max_devices_per_rank) +
                           " devices (transfers between ranks tell at most that many apart)");
  }
  return rank_transfer{
      v, l, peer_device, rank_of(peer_device), from * max_devices_per_rank + to, sending};
}

void backend::exchange(dtype t, const rank_transfer& x) {
  if (x.data.size() == 0) {
    return;
  }
  if (x.sending) {
    do_send(x.device, t, x.data, x.peer_device, x.peer_rank, x.tag);
  } else {
    do_receive(x.device, t, x.data, x.peer_device, x.peer_rank, x.tag);
  }
  count_between_ranks(static_cast<std::uint64_t>(x.data.size()) * size_of(t));
}

void backend::send(int device, dtype t, const view& src, int peer_device) {
  exchange(t, between_ranks(device, src, peer_device, true, "send"));
}

void backend::receive(int device, dtype t, const view& dst, int peer_device) {
  exchange(t, between_ranks(device, dst, peer_device, false, "receive"));
}

bool backend::groups_transfers(const reshard_plan& plan, transport how) const {
  switch (how) {
    case transport::peer:
      return false;
    case transport::nccl:
      return true;
    case transport::automatic:
      break;
  }
  return do_groups_automatically(plan);
}

bool backend::do_groups_automatically(const reshard_plan& /*plan*/) const {
  return false;
}

void backend::upload(int device, dtype t, const view& dst, const view& host_src) {
  device = local(device, "upload");
  check_view(dst, "upload");
  check_view(host_src, "upload");
  check_same_extents(dst, host_src, "upload");
  if (dst.size() == 0) {
    return;
  }
  do_upload(device, t, dst, host_src);
}

void backend::download(int device, dtype t, const view& host_dst, const view& src) {
  device = local(device, "download");
  check_view(host_dst, "download");
  check_view(src, "download");
  check_same_extents(host_dst, src, "download");
  if (src.size() == 0) {
    return;
  }
  do_download(device, t, host_dst, src);
}

void backend::fill(int device, queue_kind q, dtype t, const view& dst, scalar value) {
  device = local(device, "fill");
  check_view(dst, "fill");
  if (dst.size() == 0) {
    return;
  }
  do_fill(device, q, t, dst, value, yields_to_copies(device, q));
}

void backend::unary(int device, queue_kind q, dtype t, unary_op op, const view& dst,
                    const view& src) {
  device = local(device, "unary");
  check_view(dst, "unary");
  check_view(src, "unary");
  check_same_extents(dst, src, "unary");
  if (dst.size() == 0) {
    return;
  }
  do_unary(device, q, t, op, dst, src, yields_to_copies(device, q));
}

void backend::binary(int device, queue_kind q, dtype t, binary_op op, const view& dst,
                     const view& a, const view& b, const scalar* a_scalar, const scalar* b_scalar) {
  device = local(device, "binary");
  check_view(dst, "binary");
  if (a_scalar != nullptr && b_scalar != nullptr) {
    throw invalid_argument("darray binary: both operands are scalars");
  }
  if (a_scalar == nullptr) {
    check_view(a, "binary");
    check_same_extents(dst, a, "binary");
  }
  if (b_scalar == nullptr) {
    check_view(b, "binary");
    check_same_extents(dst, b, "binary");
  }
  if (dst.size() == 0) {
    return;
  }
  do_binary(device, q, t, op, dst, a, b, a_scalar, b_scalar, yields_to_copies(device, q));
}

void backend::binary_parts(int device, queue_kind q, dtype t, binary_op op,
                           const std::vector<binary_part>& parts) {
  device = local(device, "binary_parts");
  bool any_empty = false;
  for (const binary_part& p : parts) {
    check_view(p.dst, "binary_parts");
    check_view(p.a, "binary_parts");
    check_view(p.b, "binary_parts");
    check_same_extents(p.dst, p.a, "binary_parts");
    check_same_extents(p.dst, p.b, "binary_parts");
    any_empty = any_empty || p.dst.size() == 0;
  }
  if (!any_empty) {  // the usual case: no copy of the list
    if (!parts.empty()) {
      do_binary_parts(device, q, t, op, parts, yields_to_copies(device, q));
    }
    return;
  }
  std::vector<binary_part> work;
  std::copy_if(parts.begin(), parts.end(), std::back_inserter(work),
               [](const binary_part& p) { return p.dst.size() != 0; });
  if (!work.empty()) {
    do_binary_parts(device, q, t, op, work, yields_to_copies(device, q));
  }
}

void backend::do_binary_parts(int device, queue_kind q, dtype t, binary_op op,
                              const std::vector<binary_part>& parts, bool yielding) {
  for (const binary_part& p : parts) {
    do_binary(device, q, t, op, p.dst, p.a, p.b, nullptr, nullptr, yielding);
  }
}

void backend::accumulate(int device, queue_kind q, dtype t, reduce_op op, const view& acc,
                         const view& src) {
  device = local(device, "accumulate");
  check_view(acc, "accumulate");
  check_view(src, "accumulate");
  check_same_extents(acc, src, "accumulate");
  if (acc.size() == 0) {
    return;
  }
  do_accumulate(device, q, t, op, acc, src);
}

void backend::reduce(int device, queue_kind q, dtype t, reduce_op op, const view& acc,
                     const view& src, int axis) {
  device = local(device, "reduce");
  check_view(acc, "reduce");
  check_view(src, "reduce");
  if (axis >= static_cast<int>(src.rank)) {
    throw invalid_argument("darray reduce: axis " + std::to_string(axis) + " of a rank-" +
                           std::to_string(src.rank) + " view");
  }
  if (axis < 0) {
    if (acc.size() != 1) {
      throw invalid_argument("darray reduce: a full reduction needs a 1-element accumulator, got " +
                             std::to_string(acc.size()));
    }
  } else {
    view expect = src;
    for (std::size_t i = static_cast<std::size_t>(axis); i + 1 < src.rank; ++i) {
      expect.extent[i] = src.extent[i + 1];
    }
    expect.rank = src.rank - 1;
    check_same_extents(acc, expect, "reduce");
  }
  if (src.size() == 0) {
    return;
  }
  do_reduce(device, q, t, op, acc, src, axis);
}

void backend::gemm_accumulate(int device, queue_kind q, dtype t, const view& c, const view& a,
                              const view& b) {
  device = local(device, "gemm");
  check_view(c, "gemm");
  check_view(a, "gemm");
  check_view(b, "gemm");
  if (a.rank != 2 || b.rank != 2 || c.rank != 2) {
    throw invalid_argument("darray gemm: operands must be 2-D (ranks " + std::to_string(c.rank) +
                           ", " + std::to_string(a.rank) + ", " + std::to_string(b.rank) + ")");
  }
  if (a.extent[1] != b.extent[0] || c.extent[0] != a.extent[0] || c.extent[1] != b.extent[1]) {
    throw invalid_argument(
        "darray gemm: shapes (" + std::to_string(a.extent[0]) + ", " + std::to_string(a.extent[1]) +
        ") @ (" + std::to_string(b.extent[0]) + ", " + std::to_string(b.extent[1]) + ") -> (" +
        std::to_string(c.extent[0]) + ", " + std::to_string(c.extent[1]) + ") do not match");
  }
  for (const view* v : {&a, &b, &c}) {
    if (v->extent[1] > 1 && v->stride[1] != 1) {
      throw invalid_argument("darray gemm: operands need unit column stride, got stride " +
                             std::to_string(v->stride[1]));
    }
  }
  if (c.size() == 0) {
    return;
  }
  do_gemm_accumulate(device, q, t, c, a, b);
}

void backend::set_timeline(profiler::timeline* t) noexcept {
  timeline_.store(t, std::memory_order_release);
}

profiler::timeline* backend::attached_timeline() const noexcept {
  return timeline_.load(std::memory_order_acquire);
}

backend_stats backend::stats() const {
  const auto get = [](const std::atomic<std::uint64_t>& c) {
    return c.load(std::memory_order_relaxed);
  };
  backend_stats s;
  s.copies_local = get(counters_.copies_local);
  s.copies_peer = get(counters_.copies_peer);
  s.bytes_local = get(counters_.bytes_local);
  s.bytes_peer = get(counters_.bytes_peer);
  s.bytes_nccl = get(counters_.bytes_nccl);
  s.ops = get(counters_.ops);
  s.waits = get(counters_.waits);
  s.waits_elided = get(counters_.waits_elided);
  s.buffers_reused = get(counters_.buffers_reused);
  s.compute_yielding = get(counters_.compute_yielding);
  s.kernel_graphs_made = get(counters_.kernel_graphs_made);
  s.kernel_graph_updates = get(counters_.kernel_graph_updates);
  s.parts_visited = get(counters_.parts_visited);
  s.copies_between_ranks = get(counters_.copies_between_ranks);
  s.bytes_between_ranks = get(counters_.bytes_between_ranks);
  s.bytes_ipc = get(counters_.bytes_ipc);
  return s;
}

void backend::start_issuers(const backend_options& options, int automatic) {
  if (options.issue_threads < -1) {
    throw invalid_argument(
        "darray backend_options.issue_threads = " + std::to_string(options.issue_threads) +
        ": must be -1 (automatic), 0 (none) or a thread count");
  }
  const int wanted = options.issue_threads == -1 ? automatic : options.issue_threads;
  const int helpers = std::min(wanted, do_device_count() - 1);
  if (helpers > 0) {
    issuers_ = std::make_unique<detail::fork_join>(static_cast<std::size_t>(helpers));
  }
}

void backend::count_copy(bool peer, std::uint64_t bytes, bool nccl) noexcept {
  constexpr auto relaxed = std::memory_order_relaxed;
  if (peer) {
    counters_.copies_peer.fetch_add(1, relaxed);
    counters_.bytes_peer.fetch_add(bytes, relaxed);
    if (nccl) {
      counters_.bytes_nccl.fetch_add(bytes, relaxed);
    }
  } else {
    counters_.copies_local.fetch_add(1, relaxed);
    counters_.bytes_local.fetch_add(bytes, relaxed);
  }
}

void backend::count_between_ranks(std::uint64_t bytes) noexcept {
  counters_.copies_between_ranks.fetch_add(1, std::memory_order_relaxed);
  counters_.bytes_between_ranks.fetch_add(bytes, std::memory_order_relaxed);
}

void backend::count_ipc(std::uint64_t bytes) noexcept {
  counters_.bytes_ipc.fetch_add(bytes, std::memory_order_relaxed);
}

void backend::count_op() noexcept {
  counters_.ops.fetch_add(1, std::memory_order_relaxed);
}

bool backend::settled(const event& e) const noexcept {
  if (e.state()->known_complete()) {
    return true;
  }
  const int key = own_queue_key(e);
  return key >= 0 &&
         e.state()->sequence() <=
             tracks_.track[static_cast<std::size_t>(key)].complete.load(std::memory_order_acquire);
}

void backend::defer_free(int device, void* ptr, std::size_t bytes,
                         std::vector<event> uses) noexcept {
  // Drop the uses known to be complete (no query: the buffer's owner is going away on the
  // enqueue path; collect_deferred asks).
  std::erase_if(uses, [this](const event& e) { return settled(e); });
  if (uses.empty()) {
    do_allocator(device).deallocate(do_alloc_stream(device), ptr, bytes);
    return;
  }
  // The one queue every pending use belongs to, if there is one (see allocate with first_use).
  int queue = own_queue_key(uses.front());
  for (const auto& e : uses) {
    if (own_queue_key(e) != queue) {
      queue = -1;
      break;
    }
  }
  try {
    const std::lock_guard lock(state_mutex_);
    deferred_.push_back(deferred{device, ptr, bytes, std::move(uses), queue});
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
    deferred_bytes_.store(deferred_bytes_.load(std::memory_order_relaxed) + bytes,
                          std::memory_order_relaxed);
  } catch (...) {
    // No memory to remember it: wait for its uses instead.
    for (const auto& e : uses) {
      e.wait();
    }
    do_allocator(device).deallocate(do_alloc_stream(device), ptr, bytes);
  }
}

void backend::settle_deferred_uses() noexcept {
  const std::size_t queues = tracks().queues;
  try {
    spans_.assign(queues, queue_span{});  // allocates on the first pass only
  } catch (...) {
    return;  // no memory for the scratch: nothing settled now; a later pass asks again
  }
  // Calls f(key, state) for each deferred use that is an unsettled event of one of our queues.
  const auto each_unsettled = [this](auto&& f) {
    for (const auto& d : deferred_) {
      for (const auto& e : d.uses) {
        const int key = own_queue_key(e);
        if (key >= 0 && !settled(e)) {
          f(static_cast<std::size_t>(key), e.state());
        }
      }
    }
  };
  each_unsettled([this](std::size_t k, const detail::event_state* s) {
    queue_span& sp = spans_[k];
    if (sp.oldest == nullptr || s->sequence() < sp.oldest->sequence()) {
      sp.oldest = s;
    }
    if (sp.newest == nullptr || s->sequence() > sp.newest->sequence()) {
      sp.newest = s;
    }
  });
  const auto ready = [](const detail::event_state* s) noexcept {
    try {
      return s->ready();
    } catch (...) {
      return false;  // a failing device: synchronize() reports it
    }
  };
  // Events of a queue complete in sequence order.
  for (std::size_t k = 0; k < queues; ++k) {
    const queue_span sp = spans_[k];
    // The oldest first: pending (the devices are behind), nothing of this queue can go.
    if (sp.oldest == nullptr || !ready(sp.oldest)) {
      continue;
    }
    std::atomic<std::uint64_t>& complete = tracks_.track[k].complete;
    // Then the newest: complete (the devices keep up), everything can.
    if (sp.newest == sp.oldest || ready(sp.newest)) {
      raise_to(complete, sp.newest->sequence());
      continue;
    }
    // Else the frontier lies between: bisect this queue's sequences strictly between the two.
    raise_to(complete, sp.oldest->sequence());
    try {
      between_.clear();
      each_unsettled([&](std::size_t key, const detail::event_state* s) {
        if (key == k && s->sequence() < sp.newest->sequence()) {
          between_.push_back(s);
        }
      });
      const auto by_sequence = [](const detail::event_state* a, const detail::event_state* b) {
        return a->sequence() < b->sequence();
      };
      std::sort(between_.begin(), between_.end(), by_sequence);
      between_.erase(std::unique(between_.begin(), between_.end(),
                                 [](const detail::event_state* a, const detail::event_state* b) {
                                   return a->sequence() == b->sequence();
                                 }),
                     between_.end());
      std::size_t lo = 0;                // between_[0, lo) complete
      std::size_t hi = between_.size();  // between_[hi, size) pending
      while (lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (ready(between_[mid])) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      if (lo > 0) {
        raise_to(complete, between_[lo - 1]->sequence());
      }
    } catch (...) {
      // No memory for the list: the buffers up to the oldest go now, the rest on a later pass.
    }
  }
}

void backend::collect_deferred(bool all) noexcept {
  std::vector<deferred> done;
  {
    const std::lock_guard lock(state_mutex_);
    if (deferred_.empty()) {
      return;
    }
    if (all) {
      done.swap(deferred_);
      collect_at_count_.store(0, std::memory_order_relaxed);
      collect_at_bytes_.store(0, std::memory_order_relaxed);
    } else {
      settle_deferred_uses();
      // Events of other backends (or none): asked one by one (one query each; rare).
      const auto is_complete = [&](const event& e) {
        if (settled(e)) {
          return true;
        }
        if (own_queue_key(e) >= 0) {
          return false;  // settle_deferred_uses found it pending
        }
        try {
          return e.ready();
        } catch (...) {
          return false;  // a failing device: synchronize() reports it
        }
      };
      auto it = std::partition(deferred_.begin(), deferred_.end(), [&](const deferred& d) {
        return !std::all_of(d.uses.begin(), d.uses.end(), is_complete);
      });
      done.assign(std::make_move_iterator(it), std::make_move_iterator(deferred_.end()));
      deferred_.erase(it, deferred_.end());
    }
    std::size_t freed = 0;
    for (const auto& d : done) {
      freed += d.bytes;
    }
    const std::size_t left_bytes = deferred_bytes_.load(std::memory_order_relaxed) - freed;
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
    deferred_bytes_.store(left_bytes, std::memory_order_relaxed);
    if (!all) {
      // What is still pending is not asked again before half as much again waits: a loop of
      // small ops that runs far ahead of its devices collects at geometric intervals, each pass
      // walking the list once (amortized constant work per allocation).
      collect_at_count_.store(deferred_.size() + deferred_.size() / 2, std::memory_order_relaxed);
      collect_at_bytes_.store(left_bytes + left_bytes / 2, std::memory_order_relaxed);
    }
  }
  // A partial pass took only buffers whose uses are all complete: nothing to wait for. A full
  // one waits for the uses not known complete (after synchronize(), none: each cudaEvent wait
  // is a driver call even on a completed event, which a chain of small ops would pay per op
  // and device: docs/perf.md, "Completed events are not waited for").
  for (auto& d : done) {
    if (all) {
      for (const auto& e : d.uses) {
        if (!settled(e)) {
          try {
            e.wait();
          } catch (...) {
            // A failing device: synchronize() reports it; its buffer goes back all the same.
          }
        }
      }
    }
    do_allocator(d.device).deallocate(do_alloc_stream(d.device), d.ptr, d.bytes);
  }
}

namespace {
// A backend spec read once: the device count of "host:N" / "cuda:N" (-1 for "cuda": every GPU; 0
// for "auto"), or what is wrong with the spec.
struct parsed_spec {
  int devices = 0;
  std::string error;
};

parsed_spec parse_spec(std::string_view spec) {
  if (spec == "auto") {
    return {0, {}};
  }
  if (spec == "cuda") {
    return {-1, {}};
  }
  if (!spec.starts_with("cuda:") && !spec.starts_with("host:")) {
    return {0, "expected host:N, cuda, cuda:N or auto"};
  }
  constexpr std::string_view forms = " (host:N: N host devices; cuda:N: the first N GPUs)";
  const std::string_view digits = spec.substr(5);
  int n = 0;
  const auto* end = digits.data() + digits.size();
  const auto r = std::from_chars(digits.data(), end, n);
  if (digits.empty() || r.ec == std::errc::invalid_argument || r.ptr != end) {
    return {0, "the device count '" + std::string(digits) + "' is not a whole number" +
                   std::string(forms)};
  }
  if (r.ec != std::errc{} || n < 1 || n > 64) {
    return {0,
            "the device count " + std::string(digits) + " is outside 1..64" + std::string(forms)};
  }
  return {n, {}};
}
}  // namespace

std::string backend_spec_error(std::string_view spec) {
  return parse_spec(spec).error;
}

std::shared_ptr<backend> make_backend(std::string_view spec, const backend_options& options) {
  const parsed_spec p = parse_spec(spec);
  if (!p.error.empty()) {
    throw invalid_argument("darray backend \"" + std::string(spec) + "\": " + p.error);
  }
  if (p.devices == 0) {  // auto
    try {
      return make_cuda_backend(-1, options);
    } catch (const device_unavailable&) {
      return make_host_backend(2, options);
    }
  }
  return spec.starts_with("host:") ? make_host_backend(p.devices, options)
                                   : make_cuda_backend(p.devices, options);
}

}  // namespace poolscope::darray
