// The ops of distributed arrays: build arrays, and enqueue elementwise ops, reductions and matmul
// on a backend, with per-part events so that work waits only on the data it reads (reshards:
// reshard_executor.cpp). See distributed_array.hpp.
#include "poolscope/darray/distributed_array.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "box_index.hpp"
#include "poolscope/error.hpp"
#include "poolscope/profiler/scope.hpp"
#include "reshard_executor.hpp"
#include "scope_sites.hpp"

namespace poolscope::darray {

std::string_view to_string(array_mode m) noexcept {
  switch (m) {
    case array_mode::replica:
      return "replica";
    case array_mode::sum:
      return "sum";
    case array_mode::prod:
      return "prod";
    case array_mode::max:
      return "max";
    case array_mode::min:
      return "min";
  }
  return "?";
}

namespace {

using detail::array_state;
using detail::bytes_of;
using detail::chunks_of;
using detail::completed;
using detail::dense_buffer;
using detail::execute_reshard;
using detail::map_check;
using detail::refs_of;
using detail::view_of;
using profiler::category;

using detail::site_of;

array_mode mode_of(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return array_mode::sum;
    case reduce_op::prod:
      return array_mode::prod;
    case reduce_op::max:
      return array_mode::max;
    case reduce_op::min:
      return array_mode::min;
  }
  return array_mode::replica;
}

std::string shape_string(const shape_t& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(s[i]);
  }
  return out + (s.size() == 1 ? ",)" : ")");
}

// The result of a reduction of nothing (a sum over an axis of extent 0, a matmul whose inner
// extent is 0): a partial array of `shape` (mode `m`) whose one chunk, on the first device of
// `from`'s map, holds `identity` everywhere. No chunk of `from` has an element to give, so
// without it no chunk would cover the result's elements.
std::shared_ptr<array_state> identity_partial(const array_state& from, shape_t shape, array_mode m,
                                              scalar identity) {
  backend& be = *from.be;
  auto out = std::make_shared<array_state>();
  out->be = from.be;
  out->type = from.type;
  out->mode = m;
  out->shape = std::move(shape);
  const std::vector<int> devices = from.map.devices();
  const int device = devices.empty() ? 0 : devices.front();
  const box b = box::full(out->shape);
  auto o = dense_buffer(be, device, b, from.type, queue_kind::compute);
  be.fill(device, queue_kind::compute, from.type, view::dense(o->data(), b.extents()), identity);
  const event e = be.record(device, queue_kind::compute);
  o->add_use(e);
  out->map.add(device, b);
  out->chunks.push_back(chunk{device, b, {chunk_part{b, o, b, e}}});
  return out;
}

// Checks the shape of an array about to be made by `what`: its rank, its extents (not negative),
// its element count and its bytes (both within int64). Throws naming the shape.
void check_shape(const shape_t& shape, dtype t, const std::string& what) {
  if (shape.size() > max_rank) {
    throw invalid_index_map("darray " + what + ": rank " + std::to_string(shape.size()) +
                            " of shape " + shape_string(shape) + " exceeds the maximum rank " +
                            std::to_string(max_rank));
  }
  std::int64_t elements = 0;
  try {
    elements = element_count(shape);
  } catch (const invalid_argument& e) {
    throw invalid_argument("darray " + what + ": shape " + shape_string(shape) + ": " + e.what());
  }
  if (!bytes_of(elements, t)) {
    throw invalid_argument("darray " + what + ": shape " + shape_string(shape) + " of " +
                           std::string(to_string(t)) + " holds " + std::to_string(elements) +
                           " elements, more than INT64_MAX bytes");
  }
}

// The common checks of two-operand ops.
void check_pair(const array_state& a, const array_state& b, const char* what) {
  if (a.be != b.be) {
    throw invalid_argument(std::string("darray ") + what +
                           ": operands live on different backends (" + a.be->label() + " and " +
                           b.be->label() + ")");
  }
  if (a.type != b.type) {
    throw invalid_argument(std::string("darray ") + what + ": dtypes " +
                           std::string(to_string(a.type)) + " and " +
                           std::string(to_string(b.type)) + " differ");
  }
}

}  // namespace

const std::shared_ptr<const reshard_plan>& detail::empty_plan() {
  static const auto none = std::make_shared<const reshard_plan>();
  return none;
}

// --- array_handle ---

const array_state& array_handle::state() const {
  if (!state_) {
    throw logic_error("darray: use of an empty array handle");
  }
  return *state_;
}

const shape_t& array_handle::shape() const {
  return state().shape;
}
dtype array_handle::type() const {
  return state().type;
}
const darray::index_map& array_handle::index_map() const {
  return state().map;
}
array_mode array_handle::mode() const {
  return state().mode;
}
std::vector<int> array_handle::devices() const {
  return state().map.devices();
}
const std::vector<chunk>& array_handle::chunks() const {
  return state().chunks;
}
const chunk& array_handle::chunk_at(std::size_t index) const {
  const auto& s = state();
  if (index >= s.chunks.size()) {
    throw invalid_argument("darray: no chunk " + std::to_string(index) + " in an array of " +
                           std::to_string(s.chunks.size()) + " chunks");
  }
  return s.chunks[index];
}
const std::shared_ptr<backend>& array_handle::owner() const {
  return state().be;
}
const reshard_info& array_handle::last_reshard() const {
  return state().info;
}

void array_handle::wait() const {
  for (const auto& c : state().chunks) {
    for (const auto& p : c.parts) {
      p.ready.wait();
    }
  }
}

array_handle array_handle::from_host(std::shared_ptr<backend> be, dtype t, const void* data,
                                     std::size_t elements, const shape_t& shape,
                                     const darray::index_map& map) {
  if (!be) {
    throw invalid_argument("darray from_host: no backend");
  }
  check_shape(shape, t, "from_host");
  if (static_cast<std::int64_t>(elements) != element_count(shape)) {
    throw invalid_argument("darray from_host: " + std::to_string(elements) +
                           " host elements for shape " + shape_string(shape) + " of " +
                           std::to_string(element_count(shape)));
  }
  map.validate(shape, be->device_count());
  auto s = std::make_shared<array_state>();
  s->be = be;
  s->type = t;
  s->shape = shape;
  s->map = map;
  s->chunks = chunks_of(map);
  const box whole = box::full(shape);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): upload only reads the host view
  void* host = const_cast<void*>(data);
  for (auto& c : s->chunks) {
    if (c.region.empty()) {
      continue;
    }
    auto buf = dense_buffer(*be, c.device, c.region, t);
    be->upload(c.device, t, view::dense(buf->data(), c.region.extents()),
               view::of_box(host, whole, c.region));
    c.parts.push_back(chunk_part{c.region, std::move(buf), c.region, {}});
  }
  return array_handle(std::move(s));
}

array_handle array_handle::full(std::shared_ptr<backend> be, dtype t, scalar value,
                                const shape_t& shape, const darray::index_map& map) {
  if (!be) {
    throw invalid_argument("darray full: no backend");
  }
  check_shape(shape, t, "full");
  map.validate(shape, be->device_count());
  auto s = std::make_shared<array_state>();
  s->be = be;
  s->type = t;
  s->shape = shape;
  s->map = map;
  s->chunks = chunks_of(map);
  for (auto& c : s->chunks) {
    if (c.region.empty()) {
      continue;
    }
    auto buf = dense_buffer(*be, c.device, c.region, t, queue_kind::compute);
    be->fill(c.device, queue_kind::compute, t, view::dense(buf->data(), c.region.extents()), value);
    const event e = be->record(c.device, queue_kind::compute);
    buf->add_use(e);
    c.parts.push_back(chunk_part{c.region, std::move(buf), c.region, e});
  }
  return array_handle(std::move(s));
}

void array_handle::to_host(void* out, std::size_t elements) const {
  const std::int64_t count = element_count(state().shape);
  if (static_cast<std::int64_t>(elements) != count) {  // before completing a partial array
    throw invalid_argument("darray to_host: room for " + std::to_string(elements) +
                           " elements, the array has " + std::to_string(count));
  }
  const auto s = completed(state_);
  const box whole = box::full(s->shape);
  for (const auto& c : s->chunks) {
    for (const auto& p : c.parts) {
      p.ready.wait();
      s->be->download(c.device, s->type, view::of_box(out, whole, p.region), view_of(p, p.region));
    }
  }
}

void array_handle::chunk_to_host(std::size_t index, void* out, std::size_t elements) const {
  const auto& s = state();
  const chunk& c = chunk_at(index);
  if (static_cast<std::int64_t>(elements) != c.region.size()) {
    throw invalid_argument("darray chunk_to_host: room for " + std::to_string(elements) +
                           " elements, chunk " + std::to_string(index) + " has " +
                           std::to_string(c.region.size()));
  }
  for (const auto& p : c.parts) {
    p.ready.wait();
    s.be->download(c.device, s.type, view::of_box(out, c.region, p.region), view_of(p, p.region));
  }
}

array_handle array_handle::reshard(const darray::index_map& map,
                                   const reshard_options& options) const {
  const auto& s = state();
  if (options.split_bytes < 0) {
    throw invalid_argument("darray reshard: split_bytes " + std::to_string(options.split_bytes) +
                           " is negative");
  }
  return array_handle(execute_reshard(s, map, options, map_check::cover));
}

array_handle array_handle::change_mode(array_mode m) const {
  const auto& s = state();
  if (m == s.mode) {
    return *this;
  }
  if (m != array_mode::replica) {
    throw logic_error("darray change_mode: from " + std::string(to_string(s.mode)) + " to " +
                      std::string(to_string(m)) + " is not supported (only partial -> replica)");
  }
  return array_handle(completed(state_));
}

namespace {
// Chunks of fewer elements than this compute all their parts in one task (binary ops).
constexpr std::int64_t batch_parts_below = std::int64_t{1} << 20;

// A new replica-mode state on `s`'s backend, dtype, shape and map, with empty chunks.
std::shared_ptr<array_state> same_layout(const array_state& s) {
  auto out = std::make_shared<array_state>();
  out->be = s.be;
  out->type = s.type;
  out->shape = s.shape;
  out->map = s.map;
  // The map's chunks, as s has them (chunks_of(s.map), without walking the map again).
  out->chunks.reserve(s.chunks.size());
  for (const chunk& c : s.chunks) {
    out->chunks.push_back(chunk{c.device, c.region, {}});
  }
  return out;
}

// An elementwise op of one array: per part of every chunk, as soon as that part is ready,
// enqueue(device, dst, src) on the device's compute queue into a new dense buffer per chunk.
// The output buffer of each non-empty chunk of `s`, with the chunk's index. Elementwise ops take
// them all on the calling thread first (so allocations are attributed to the caller's scopes and
// stacks), then enqueue each chunk's work through backend::issue_each, chunks (one per device)
// at once.
std::vector<std::pair<std::size_t, std::shared_ptr<buffer>>> output_buffers(backend& be,
                                                                            const array_state& s) {
  std::vector<std::pair<std::size_t, std::shared_ptr<buffer>>> outputs;
  outputs.reserve(s.chunks.size());
  for (std::size_t j = 0; j < s.chunks.size(); ++j) {
    if (!s.chunks[j].region.empty()) {
      outputs.emplace_back(
          j, dense_buffer(be, s.chunks[j].device, s.chunks[j].region, s.type, queue_kind::compute));
    }
  }
  return outputs;
}

// Enqueues the element-wise work of `jobs` chunks (one per job) in rounds: round r enqueues the
// r-th part of every large chunk, so every device's first parts (those in place, when the parts
// came from a reshard) go before any device's parts that wait for a copy; a small chunk (`whole`)
// has all its parts done in round 0, so a small op is one pass over the devices however many
// parts it has. parts(k): job k's part count; work(k, first, last): enqueue its parts [first,
// last) (all of them for a whole chunk). Each later round hands issue_each only the jobs with a
// part left (in job order), so the rounds cost the parts, not the rounds times the chunks.
template <typename Parts, typename Whole, typename Work>
void issue_in_rounds(backend& be, std::size_t jobs, Parts parts, Whole whole, Work work) {
  be.issue_each(jobs, [&](std::size_t k) {
    if (whole(k)) {
      work(k, std::size_t{0}, parts(k));
    } else if (parts(k) > 0) {
      work(k, std::size_t{0}, std::size_t{1});
    }
  });
  std::vector<std::size_t> left;  // the large jobs with parts after this round's
  for (std::size_t k = 0; k < jobs; ++k) {
    if (!whole(k) && parts(k) > 1) {
      left.push_back(k);
    }
  }
  for (std::size_t round = 1; !left.empty(); ++round) {
    be.issue_each(left.size(), [&](std::size_t i) { work(left[i], round, round + 1); });
    std::erase_if(left, [&](std::size_t k) { return parts(k) <= round + 1; });
  }
}

template <typename Enqueue>
std::shared_ptr<array_state> map_parts(const array_state& s, Enqueue enqueue) {
  backend& be = *s.be;
  auto out = same_layout(s);
  const auto jobs = output_buffers(be, s);
  std::uint64_t visited = 0;
  for (std::size_t j = 0; j < s.chunks.size(); ++j) {
    visited += s.chunks[j].parts.size();
    out->chunks[j].parts.reserve(s.chunks[j].parts.size());
  }
  be.count_parts_visited(visited);
  issue_in_rounds(
      be, jobs.size(), [&](std::size_t k) { return s.chunks[jobs[k].first].parts.size(); },
      [&](std::size_t k) { return s.chunks[jobs[k].first].region.size() < batch_parts_below; },
      [&](std::size_t k, std::size_t first, std::size_t last) {
        const auto& [j, o] = jobs[k];
        const chunk& c = s.chunks[j];
        for (std::size_t i = first; i < last; ++i) {
          const chunk_part& q = c.parts[i];
          be.wait(c.device, queue_kind::compute, q.ready);
          enqueue(c.device, view::of_box(o->data(), c.region, q.region), view_of(q, q.region));
          const event e = be.record(c.device, queue_kind::compute);
          q.storage->add_use(e);
          o->add_use(e);
          out->chunks[j].parts.push_back(chunk_part{q.region, o, c.region, e});
        }
      });
  return out;
}

// Elementwise with a scalar on one side.
std::shared_ptr<array_state> binary_scalar(binary_op op, const array_state& s, scalar v,
                                           bool scalar_left) {
  const profiler::scope op_scope{site_of(op)};
  return map_parts(s, [&](int device, const view& dst, const view& in) {
    s.be->binary(device, queue_kind::compute, s.type, op, dst, in, in, scalar_left ? &v : nullptr,
                 scalar_left ? nullptr : &v);
  });
}
}  // namespace

array_handle array_handle::unary(unary_op op) const {
  (void)state();
  const auto s = completed(state_);
  const profiler::scope op_scope{site_of(op)};
  return array_handle(map_parts(*s, [&](int device, const view& dst, const view& src) {
    s->be->unary(device, queue_kind::compute, s->type, op, dst, src);
  }));
}

array_handle array_handle::binary(binary_op op, const array_handle& a, const array_handle& b) {
  const auto& as = a.state();
  const auto& bs = b.state();
  check_pair(as, bs, to_string(op).data());
  if (as.shape != bs.shape) {
    throw invalid_index_map("darray " + std::string(to_string(op)) + ": shapes " +
                            shape_string(as.shape) + " and " + shape_string(bs.shape) + " differ");
  }
  const auto x = completed(a.state_);
  auto y = completed(b.state_);
  const profiler::scope op_scope{site_of(op)};
  backend& be = *x->be;
  auto out = same_layout(*x);
  const auto jobs = output_buffers(be, *x);
  // The right operand's parts of each chunk paired with the left's, in arrival order (local
  // first, then pieces as they are sent); parts_done[k]: how many of job k's right parts have
  // their compute enqueued.
  struct pair_part {
    const chunk_part* a;
    const chunk_part* b;
    box region;
  };
  std::vector<std::size_t> parts_done(jobs.size(), 0);
  std::uint64_t visited = 0;
  // Enqueues the compute of the right parts of `ys` not yet done; with `in_place` (each chunk's
  // count of leading parts in place), only those, and only for chunks large enough to compute
  // part by part (a small chunk's parts go in one task once all have arrived, below).
  const auto issue = [&](const array_state& ys, const std::vector<std::size_t>* in_place) {
    // Job k's pairs are pairs[begin[k], begin[k + 1]) (one vector for all jobs: a small op
    // allocates per op, not per device).
    std::vector<pair_part> pairs;
    pairs.reserve(jobs.size());
    std::vector<std::size_t> begin(jobs.size() + 1, 0);
    for (std::size_t k = 0; k < jobs.size(); ++k) {
      begin[k] = pairs.size();
      const std::size_t j = jobs[k].first;
      if (in_place != nullptr && x->chunks[j].region.size() < batch_parts_below) {
        continue;
      }
      const auto& parts = ys.chunks[j].parts;
      const auto& left = x->chunks[j].parts;
      const std::size_t from = parts_done[k];
      const std::size_t end = in_place != nullptr ? (*in_place)[j] : parts.size();
      // Each right part with the left parts it meets, in the right parts' order (arrival).
      visited += detail::for_each_meeting(
          left.size(), [&](std::size_t i) -> const box& { return left[i].region; }, end - from,
          [&](std::size_t i) -> const box& { return parts[from + i].region; },
          [&](std::size_t l, std::size_t r, box common) {
            pairs.push_back(pair_part{&left[l], &parts[from + r], std::move(common)});
          });
      parts_done[k] = end;
      // One output part per pair (room made once: a chunk of many parts would otherwise grow
      // its list by copies).
      auto& made = out->chunks[j].parts;
      made.reserve(made.size() + (pairs.size() - begin[k]));
    }
    begin[jobs.size()] = pairs.size();
    issue_in_rounds(
        be, jobs.size(), [&](std::size_t k) { return begin[k + 1] - begin[k]; },
        [&](std::size_t k) { return x->chunks[jobs[k].first].region.size() < batch_parts_below; },
        [&](std::size_t k, std::size_t first, std::size_t last) {
          const auto& [j, o] = jobs[k];
          const pair_part* const mine = pairs.data() + begin[k];
          const chunk& c = x->chunks[j];
          const auto done = [&](const pair_part& p, const event& e) {
            p.a->storage->add_use(e);
            p.b->storage->add_use(e);
            o->add_use(e);
            out->chunks[j].parts.push_back(chunk_part{p.region, o, c.region, e});
          };
          if (last - first > 1) {
            // A small chunk: all its parts in one task once all their inputs are there (a launch
            // costs more than computing a small part early would gain).
            std::vector<backend::binary_part> parts;
            parts.reserve(last - first);
            for (std::size_t i = first; i < last; ++i) {
              const pair_part& p = mine[i];
              be.wait(c.device, queue_kind::compute, p.a->ready);
              be.wait(c.device, queue_kind::compute, p.b->ready);
              parts.push_back({view::of_box(o->data(), c.region, p.region), view_of(*p.a, p.region),
                               view_of(*p.b, p.region)});
            }
            be.binary_parts(c.device, queue_kind::compute, x->type, op, parts);
            const event e = be.record(c.device, queue_kind::compute);
            for (std::size_t i = first; i < last; ++i) {
              done(mine[i], e);
            }
            return;
          }
          // One part (of a large chunk: each computed as soon as it and the left operand's data
          // are there).
          for (std::size_t i = first; i < last; ++i) {
            const pair_part& p = mine[i];
            be.wait(c.device, queue_kind::compute, p.a->ready);
            be.wait(c.device, queue_kind::compute, p.b->ready);
            be.binary(c.device, queue_kind::compute, x->type, op,
                      view::of_box(o->data(), c.region, p.region), view_of(*p.a, p.region),
                      view_of(*p.b, p.region));
            done(p, be.record(c.device, queue_kind::compute));
          }
        });
  };
  if (!(y->map == x->map)) {
    // The parts already in place are computed while the first pieces move (execute_reshard).
    y = execute_reshard(*y, x->map, {}, map_check::none,
                        [&](const array_state& ys, const std::vector<std::size_t>& in_place) {
                          issue(ys, &in_place);
                        });
  }
  out->info = y->info;
  issue(*y, nullptr);
  be.count_parts_visited(visited);
  return array_handle(std::move(out));
}

array_handle array_handle::binary(binary_op op, const array_handle& a, scalar b) {
  (void)a.state();
  return array_handle(binary_scalar(op, *completed(a.state_), b, false));
}

array_handle array_handle::binary(binary_op op, scalar a, const array_handle& b) {
  (void)b.state();
  return array_handle(binary_scalar(op, *completed(b.state_), a, true));
}

array_handle array_handle::reduce(reduce_op op, std::optional<std::size_t> axis) const {
  const auto& s0 = state();
  if (axis && *axis >= s0.shape.size()) {
    throw invalid_argument("darray " + std::string(to_string(op)) + ": axis " +
                           std::to_string(*axis) + " of an array of shape " +
                           shape_string(s0.shape));
  }
  shape_t out_shape;
  if (axis) {
    out_shape = s0.shape;
    out_shape.erase(out_shape.begin() + static_cast<std::ptrdiff_t>(*axis));
  }
  // The result may hold more than the array (a sum over an axis of extent 0).
  check_shape(out_shape, s0.type, std::string(to_string(op)));
  // Nothing to reduce, yet elements to give (a full reduction of a zero-size array, or one over
  // an axis of extent 0): no chunk would hold them. Sum and prod of nothing are their identity
  // (0, 1), as in NumPy; max and min of nothing have none.
  const bool of_nothing = element_count(s0.shape) == 0 && element_count(out_shape) != 0;
  if (of_nothing && (op == reduce_op::max || op == reduce_op::min)) {
    throw invalid_argument("darray " + std::string(to_string(op)) +
                           (axis ? " over axis " + std::to_string(*axis) : std::string()) +
                           ": the array of shape " + shape_string(s0.shape) +
                           " has no elements to reduce, and " + std::string(to_string(op)) +
                           " of nothing has no identity");
  }
  const auto s = completed(state_);
  const profiler::scope op_scope{site_of(op)};
  if (of_nothing) {
    return array_handle(
        identity_partial(*s, std::move(out_shape), mode_of(op), identity(op, s->type)));
  }
  backend& be = *s->be;
  auto out = std::make_shared<array_state>();
  out->be = s->be;
  out->type = s->type;
  out->mode = mode_of(op);
  out->shape = std::move(out_shape);
  const auto owned = owned_regions(refs_of(s->chunks));
  std::uint64_t visited = s->chunks.size();
  for (std::size_t i = 0; i < s->chunks.size(); ++i) {
    const chunk& c = s->chunks[i];
    if (owned[i].empty() || c.region.empty()) {
      continue;
    }
    const box out_box = axis ? drop_axis(c.region, *axis) : box{};
    auto o = dense_buffer(be, c.device, out_box, s->type, queue_kind::compute);
    be.fill(c.device, queue_kind::compute, s->type, view::dense(o->data(), out_box.extents()),
            identity(op, s->type));
    std::vector<std::shared_ptr<buffer>> used;
    // Each owned region with the parts it meets, in the owned regions' order, then the parts'.
    visited += detail::for_each_meeting(
        c.parts.size(), [&](std::size_t k) -> const box& { return c.parts[k].region; },
        owned[i].size(), [&](std::size_t k) -> const box& { return owned[i][k]; },
        [&](std::size_t k, std::size_t, const box& r) {
          const chunk_part& q = c.parts[k];
          be.wait(c.device, queue_kind::compute, q.ready);
          const view acc = axis ? view::of_box(o->data(), out_box, drop_axis(r, *axis))
                                : view::dense(o->data(), {});
          be.reduce(c.device, queue_kind::compute, s->type, op, acc, view_of(q, r),
                    axis ? static_cast<int>(*axis) : -1);
          used.push_back(q.storage);
        });
    const event e = be.record(c.device, queue_kind::compute);
    o->add_use(e);
    for (const auto& u : used) {
      u->add_use(e);
    }
    out->map.add(c.device, out_box);
    out->chunks.push_back(chunk{c.device, out_box, {chunk_part{out_box, o, out_box, e}}});
  }
  // chunks must be in map.chunks() order (by device, then position).
  std::stable_sort(out->chunks.begin(), out->chunks.end(),
                   [](const chunk& l, const chunk& r) { return l.device < r.device; });
  be.count_parts_visited(visited);
  return array_handle(std::move(out));
}

namespace {
// `s` as slices of step 1: itself when it has step 1 (or fewer than two indices), else one slice
// per index.
std::vector<slice> unit_runs(const slice& s) {
  const std::int64_t n = s.size();
  if (s.step == 1 || n < 2) {
    return {s};
  }
  std::vector<slice> out;
  out.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t at = s.start + i * s.step;  // an index of s: no overflow
    out.emplace_back(at, at + 1);
  }
  return out;
}
}  // namespace

array_handle array_handle::matmul(const array_handle& a, const array_handle& b) {
  const auto& as0 = a.state();
  const auto& bs0 = b.state();
  check_pair(as0, bs0, "matmul");
  if (as0.shape.size() != 2 || bs0.shape.size() != 2 || as0.shape[1] != bs0.shape[0]) {
    throw invalid_index_map("darray matmul: shapes " + shape_string(as0.shape) + " @ " +
                            shape_string(bs0.shape) + " do not match (2-D, inner extents equal)");
  }
  // The result may hold more than both operands (an inner extent of 0 makes them empty).
  check_shape({as0.shape[0], bs0.shape[1]}, as0.type, "matmul");
  const auto x = completed(a.state_);
  const auto y = completed(b.state_);
  if (x->shape[1] == 0) {
    // An inner extent of 0: every element is a sum of nothing (zeros, as in NumPy).
    return array_handle(
        identity_partial(*x, {x->shape[0], y->shape[1]}, array_mode::sum, scalar::of(0)));
  }
  static const profiler::scope_site matmul_site{"darray.matmul", category::darray_compute};
  const profiler::scope op_scope{matmul_site};
  backend& be = *x->be;
  const std::int64_t n = y->shape[1];
  // Where each owned block of `a` needs rows of `b`: one destination chunk per block.
  const auto owned = owned_regions(refs_of(x->chunks));
  darray::index_map need;
  // An owned block of a chunk of `a`, with the chunk's parts inside it (part index, region).
  struct task {
    std::size_t a_chunk;
    box a_block;
    std::vector<std::pair<std::size_t, box>> a_parts;
  };
  std::vector<task> tasks;
  std::uint64_t visited = x->chunks.size();
  for (std::size_t i = 0; i < x->chunks.size(); ++i) {
    const std::size_t first = tasks.size();
    for (const auto& o : owned[i]) {
      if (o.empty()) {
        continue;
      }
      need.add(x->chunks[i].device, box{{o.dims[1], slice{0, n}}});
      tasks.push_back(task{i, o, {}});
    }
    const auto& parts = x->chunks[i].parts;
    visited += detail::for_each_meeting(
        parts.size(), [&](std::size_t k) -> const box& { return parts[k].region; },
        tasks.size() - first, [&](std::size_t t) -> const box& { return tasks[first + t].a_block; },
        [&](std::size_t k, std::size_t t, box common) {
          tasks[first + t].a_parts.emplace_back(k, std::move(common));
        });
  }
  const auto rows = execute_reshard(*y, need, {}, map_check::bounds);

  auto out = std::make_shared<array_state>();
  out->be = x->be;
  out->type = x->type;
  out->shape = {x->shape[0], n};
  out->mode = array_mode::sum;
  out->info = rows->info;
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    const chunk& ac = x->chunks[tasks[t].a_chunk];
    const box& blk = tasks[t].a_block;
    const box c_box{{blk.dims[0], slice{0, n}}};
    const int d = ac.device;
    auto o = dense_buffer(be, d, c_box, x->type, queue_kind::compute);
    be.fill(d, queue_kind::compute, x->type, view::dense(o->data(), c_box.extents()),
            scalar::of(0));
    std::vector<std::shared_ptr<buffer>> used;
    // Rows of b in arrival order: each block multiplies as soon as it is there, with the parts of
    // a whose columns (the inner axis) meet its rows.
    const auto& a_parts = tasks[t].a_parts;
    const auto& b_parts = rows->chunks[t].parts;
    visited += detail::for_each_meeting(
        a_parts.size(), [&](std::size_t i) { return box{{a_parts[i].second.dims[1]}}; },
        b_parts.size(), [&](std::size_t i) { return box{{b_parts[i].region.dims[0]}}; },
        [&](std::size_t ia, std::size_t ib, const box& inner) {
          const chunk_part& pa = ac.parts[a_parts[ia].first];
          const box& ra = a_parts[ia].second;
          const chunk_part& pb = b_parts[ib];
          be.wait(d, queue_kind::compute, pa.ready);
          be.wait(d, queue_kind::compute, pb.ready);
          // A gemm needs unit column strides: a strided k (the columns of a) or strided columns
          // of b (and so of c) go as one gemm per index.
          for (const slice& kr : unit_runs(inner.dims[0])) {
            for (const slice& cols : unit_runs(pb.region.dims[1])) {
              const box a_box{{ra.dims[0], kr}};
              const box b_box{{kr, cols}};
              const box out_box{{ra.dims[0], cols}};
              be.gemm_accumulate(d, queue_kind::compute, x->type,
                                 view::of_box(o->data(), c_box, out_box), view_of(pa, a_box),
                                 view_of(pb, b_box));
            }
          }
          used.push_back(pa.storage);
          used.push_back(pb.storage);
        });
    const event e = be.record(d, queue_kind::compute);
    o->add_use(e);
    for (const auto& u : used) {
      u->add_use(e);
    }
    out->map.add(d, c_box);
    out->chunks.push_back(chunk{d, c_box, {chunk_part{c_box, o, c_box, e}}});
  }
  std::stable_sort(out->chunks.begin(), out->chunks.end(),
                   [](const chunk& l, const chunk& r) { return l.device < r.device; });
  be.count_parts_visited(visited);
  return array_handle(std::move(out));
}

}  // namespace poolscope::darray
