#include "poolscope/darray/planner.hpp"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <utility>

namespace poolscope::darray {
namespace {

__extension__ using wide = __int128;

// Both boxes hold the same elements.
bool same_elements(const box& a, const box& b) noexcept {
  return a.contains(b) && b.contains(a);
}

// "source chunk 3 (device 1, box [0:8])": how errors name a chunk.
std::string chunk_name(const std::vector<chunk_ref>& list, std::size_t k, const char* side) {
  return std::string(side) + " chunk " + std::to_string(k) + " (device " +
         std::to_string(list[k].device) + ", box " + list[k].region.to_string() + ")";
}

void check_ranks(const std::vector<chunk_ref>& src, const std::vector<chunk_ref>& dst) {
  const std::vector<chunk_ref>* first_list = !src.empty() ? &src : &dst;
  if (first_list->empty()) {
    return;
  }
  const std::size_t rank = first_list->front().region.rank();
  const auto check = [&](const std::vector<chunk_ref>& list, const char* side) {
    for (std::size_t k = 0; k < list.size(); ++k) {
      if (list[k].region.rank() != rank) {
        throw invalid_index_map(
            "plan_reshard: " + chunk_name(list, k, side) + " has rank " +
            std::to_string(list[k].region.rank()) + ", " +
            chunk_name(*first_list, 0, first_list == &src ? "source" : "destination") +
            " has rank " + std::to_string(rank));
      }
    }
  };
  check(src, "source");
  check(dst, "destination");
}

// --- plan_cache keys ---

std::uint64_t mix(std::uint64_t h, std::uint64_t v) noexcept {
  // One round of a boost-style hash combine, then a 64-bit multiplicative mix.
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

std::uint64_t mix_box(std::uint64_t h, const box& b) noexcept {
  h = mix(h, b.dims.size());
  for (const slice& d : b.dims) {
    h = mix(mix(mix(h, static_cast<std::uint64_t>(d.start)), static_cast<std::uint64_t>(d.stop)),
            static_cast<std::uint64_t>(d.step));
  }
  return h;
}

std::uint64_t hash_key(const std::vector<chunk_ref>& src, const shape_t& shape,
                       const index_map& dst, bool covering, const plan_options& o) noexcept {
  std::uint64_t h = mix(0, src.size());
  for (const chunk_ref& c : src) {
    h = mix_box(mix(mix(h, static_cast<std::uint64_t>(c.device)), c.index), c.region);
  }
  h = mix(h, shape.size());
  for (const std::int64_t e : shape) {
    h = mix(h, static_cast<std::uint64_t>(e));
  }
  for (const auto& [device, boxes] : dst.parts()) {
    h = mix(mix(h, static_cast<std::uint64_t>(device)), boxes.size());
    for (const box& b : boxes) {
      h = mix_box(h, b);
    }
  }
  h = mix(mix(h, covering ? 1 : 0), o.element_size);
  return mix(mix(h, static_cast<std::uint64_t>(o.split_bytes)), o.accumulate ? 1 : 0);
}

// Whether `k` is the key made of these fields.
bool same_key(const plan_key& k, const std::vector<chunk_ref>& src, const shape_t& shape,
              const index_map& dst, bool covering, const plan_options& options) noexcept {
  return k.covering == covering && k.options == options && k.shape == shape && k.src == src &&
         k.dst == dst;
}

// Offset of the first element of `part` in the row-major storage of `whole` (part inside whole).
std::int64_t storage_offset(const box& whole, const box& part) {
  const box local = local_slices(whole, part);
  const shape_t extents = whole.extents();
  std::int64_t offset = 0;
  for (std::size_t axis = 0; axis < local.rank(); ++axis) {
    offset = offset * extents[axis] + local.dims[axis].start;
  }
  return offset;
}

// `region` cut along its outermost axes into boxes of at most `limit` bytes each (a single element
// larger than `limit` stays whole), in index order.
void split_region(const box& region, std::int64_t element_size, std::int64_t limit,
                  std::vector<box>& out) {
  const std::int64_t bytes = region.size() * element_size;
  const auto axis_it = std::find_if(region.dims.begin(), region.dims.end(),
                                    [](const slice& s) { return s.size() > 1; });
  if (bytes <= limit || axis_it == region.dims.end()) {
    out.push_back(region);
    return;
  }
  const std::int64_t rows = axis_it->size();
  const std::int64_t row_bytes = bytes / rows;
  if (row_bytes > limit) {
    // One index of the outer axis is still too big: cut it into single indices, then go inward.
    for (const box& row : split_outer(region, static_cast<std::size_t>(rows))) {
      split_region(row, element_size, limit, out);
    }
    return;
  }
  const std::int64_t rows_per_part = limit / row_bytes;
  const std::int64_t parts = (rows + rows_per_part - 1) / rows_per_part;
  for (box& part : split_outer(region, static_cast<std::size_t>(parts))) {
    out.push_back(std::move(part));
  }
}

// Builds the pieces of one plan; see plan_reshard.
class plan_builder {
 public:
  plan_builder(const std::vector<chunk_ref>& src, const std::vector<chunk_ref>& dst,
               const plan_options& options)
      : src_(src),
        dst_(dst),
        options_(options),
        element_size_(static_cast<std::int64_t>(options.element_size)),
        received_(dst.size()) {}

  reshard_plan build() {
    for (std::size_t j = 0; j < dst_.size(); ++j) {
      if (dst_[j].region.empty()) {
        continue;
      }
      if (options_.accumulate) {
        plan_partial(j);
      } else {
        plan_replica(j);
      }
    }
    return finish();
  }

 private:
  // A piece of `region` into destination chunk j from chunk `from` on device `from_device`.
  [[nodiscard]] piece make_piece(std::size_t from, int from_device, std::size_t j,
                                 box region) const {
    piece p;
    p.src_chunk = from;
    p.dst_chunk = j;
    p.src_device = from_device;
    p.dst_device = dst_[j].device;
    p.bytes = region.size() * element_size_;
    p.local = p.src_device == p.dst_device;
    p.region = std::move(region);
    return p;
  }

  void emit(std::size_t i, std::size_t j, box region) {
    piece p = make_piece(i, src_[i].device, j, std::move(region));
    p.in_place = p.local && same_elements(src_[i].region, dst_[j].region);
    if (!p.local) {
      load_[p.src_device] += p.bytes;
      if (!options_.accumulate) {
        received_[j].push_back(p.region);
      }
    }
    (p.local ? local_ : remote_).push_back(std::move(p));
  }

  // Takes the parts of `rest` that destination chunk k (before j, on j's device) receives from
  // another device, leaving the others in `rest`: they cross to the device once, into chunk k.
  void take_received(std::size_t k, std::size_t j, std::vector<box>& rest) {
    for (const box& got : received_[k]) {
      carve(rest, got, [&](box c) {
        piece p = make_piece(k, dst_[j].device, j, std::move(c));  // local: the same device
        p.from_dst = true;
        from_dst_.push_back(std::move(p));
      });
    }
  }

  // Every intersection is a piece: the executor reduces them.
  void plan_partial(std::size_t j) {
    for (std::size_t i = 0; i < src_.size(); ++i) {
      if (auto c = intersect(src_[i].region, dst_[j].region)) {
        emit(i, j, std::move(*c));
      }
    }
  }

  // Takes the parts of `rest` that source chunk i holds, leaving the others in `rest`.
  void take_from(std::size_t i, std::size_t j, std::vector<box>& rest) {
    carve(rest, src_[i].region, [&](box c) { emit(i, j, std::move(c)); });
  }

  // Hands `take` each part of `rest` inside `holder` and leaves the others in `rest`.
  template <typename Take>
  static void carve(std::vector<box>& rest, const box& holder, Take&& take) {
    std::vector<box> next;
    for (const box& r : rest) {
      std::optional<box> c = intersect(r, holder);
      if (!c) {
        next.push_back(r);
        continue;
      }
      take(std::move(*c));
      std::vector<box> left = subtract(r, holder);
      next.insert(next.end(), std::make_move_iterator(left.begin()),
                  std::make_move_iterator(left.end()));
    }
    rest = std::move(next);
  }

  // Each element of the destination chunk once: from its own device if held there (a chunk with
  // the same box first, so that it is in place), else from an earlier destination chunk on the
  // device that receives it (so it crosses once), else from the least-loaded remote holder.
  void plan_replica(std::size_t j) {
    const int device = dst_[j].device;
    std::vector<std::size_t> locals;
    for (std::size_t i = 0; i < src_.size(); ++i) {
      if (src_[i].device == device && !src_[i].region.empty()) {
        locals.push_back(i);
      }
    }
    std::stable_partition(locals.begin(), locals.end(), [&](std::size_t i) {
      return same_elements(src_[i].region, dst_[j].region);
    });
    std::vector<box> rest{dst_[j].region};
    for (const std::size_t i : locals) {
      take_from(i, j, rest);
    }
    for (std::size_t k = 0; k < j && !rest.empty(); ++k) {
      if (dst_[k].device == device && !received_[k].empty()) {
        take_received(k, j, rest);
      }
    }
    // A region goes to the least-loaded device among those holding any of it; what that device
    // does not hold goes back to the front of the queue. Every element so comes from the least-
    // loaded of its own holders, and each round removes a holder, so the loop ends.
    std::deque<box> queue(rest.begin(), rest.end());
    while (!queue.empty()) {
      const box r = std::move(queue.front());
      queue.pop_front();
      std::optional<int> chosen;
      for (const chunk_ref& s : src_) {
        if (s.device == device || (chosen && load_[s.device] > load_[*chosen]) ||
            (chosen && load_[s.device] == load_[*chosen] && s.device >= *chosen)) {
          continue;
        }
        if (intersect(r, s.region)) {
          chosen = s.device;
        }
      }
      if (!chosen) {
        continue;  // no source holds it: left out (see plan_reshard)
      }
      std::vector<box> parts{r};
      for (std::size_t i = 0; i < src_.size(); ++i) {
        if (src_[i].device == *chosen) {
          take_from(i, j, parts);
        }
      }
      queue.insert(queue.begin(), parts.begin(), parts.end());
    }
  }

  reshard_plan finish() {
    std::vector<piece> remote;
    if (options_.split_bytes > 0) {
      for (piece& p : remote_) {
        if (p.bytes <= options_.split_bytes) {
          remote.push_back(std::move(p));
          continue;
        }
        std::vector<box> parts;
        split_region(p.region, element_size_, options_.split_bytes, parts);
        for (box& part : parts) {
          piece q = p;
          q.bytes = part.size() * element_size_;
          q.region = std::move(part);
          remote.push_back(std::move(q));
        }
      }
    } else {
      remote = std::move(remote_);
    }
    // Each from_dst piece cut along the remote pieces (after splitting) of the chunk it takes
    // from: every part follows the one piece it waits for.
    std::vector<std::vector<std::size_t>> remote_into(dst_.size());
    for (std::size_t k = 0; k < remote.size(); ++k) {
      remote_into[remote[k].dst_chunk].push_back(k);
    }
    std::vector<std::vector<piece>> after(remote.size());
    for (const piece& p : from_dst_) {
      for (const std::size_t k : remote_into[p.src_chunk]) {
        if (std::optional<box> c = intersect(p.region, remote[k].region)) {
          piece q = p;
          q.bytes = c->size() * element_size_;
          q.region = std::move(*c);
          after[k].push_back(std::move(q));
        }
      }
    }
    // Position in the destination chunk as a fraction offset / size, compared exactly. A piece
    // that later chunks also read (from_dst) takes the earliest of their positions, so each of
    // them gets its first elements early too.
    const auto earlier = [](const std::pair<std::int64_t, std::int64_t>& a,
                            const std::pair<std::int64_t, std::int64_t>& b) {
      return wide{a.first} * b.second < wide{b.first} * a.second;
    };
    const auto position_of = [&](const piece& p) {
      const box& whole = dst_[p.dst_chunk].region;
      return std::pair<std::int64_t, std::int64_t>{storage_offset(whole, p.region), whole.size()};
    };
    std::vector<std::pair<std::int64_t, std::int64_t>> position(remote.size());
    for (std::size_t k = 0; k < remote.size(); ++k) {
      position[k] = position_of(remote[k]);
      for (const piece& q : after[k]) {
        const auto at = position_of(q);
        if (earlier(at, position[k])) {
          position[k] = at;
        }
      }
    }
    std::vector<std::size_t> order(remote.size());
    for (std::size_t k = 0; k < order.size(); ++k) {
      order[k] = k;
    }
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      if (earlier(position[a], position[b])) {
        return true;
      }
      if (earlier(position[b], position[a])) {
        return false;
      }
      if (remote[a].dst_device != remote[b].dst_device) {
        return remote[a].dst_device < remote[b].dst_device;
      }
      return remote[a].src_device < remote[b].src_device;
    });

    reshard_plan plan;
    plan.pieces = std::move(local_);
    for (const std::size_t k : order) {
      plan.pieces.push_back(std::move(remote[k]));
      for (piece& q : after[k]) {
        plan.pieces.push_back(std::move(q));
      }
    }
    plan.pieces_of_dst.resize(dst_.size());
    std::map<std::pair<int, int>, std::int64_t> links;
    for (std::size_t k = 0; k < plan.pieces.size(); ++k) {
      const piece& p = plan.pieces[k];
      plan.pieces_of_dst[p.dst_chunk].push_back(k);
      if (p.local) {
        plan.bytes_local += p.bytes;
        if (p.in_place) {
          plan.bytes_in_place += p.bytes;
        }
      } else {
        plan.bytes_remote += p.bytes;
        links[{p.src_device, p.dst_device}] += p.bytes;
      }
    }
    for (const auto& [link, bytes] : links) {
      plan.link_bytes.emplace_back(link.first, link.second, bytes);
    }
    return plan;
  }

  const std::vector<chunk_ref>& src_;
  const std::vector<chunk_ref>& dst_;
  const plan_options& options_;
  std::int64_t element_size_;
  std::vector<piece> local_;
  std::vector<piece> remote_;
  std::vector<piece> from_dst_;             // before splitting: cut in finish()
  std::vector<std::vector<box>> received_;  // per destination chunk: remote regions (unsplit)
  std::map<int, std::int64_t> load_;        // remote bytes assigned to each source device so far
};

}  // namespace

std::string reshard_plan::to_string() const {
  std::string s = "reshard plan: " + std::to_string(pieces.size()) + " pieces, " +
                  std::to_string(bytes_remote) + " B remote, " + std::to_string(bytes_local) +
                  " B local (" + std::to_string(bytes_in_place) + " B in place)\n";
  for (const piece& p : pieces) {
    s += "  " + p.region.to_string() + " " + std::to_string(p.src_device) + "->" +
         std::to_string(p.dst_device) + (p.from_dst ? " (from dst chunk " : " (src chunk ") +
         std::to_string(p.src_chunk) + ", dst chunk " + std::to_string(p.dst_chunk) + ") " +
         std::to_string(p.bytes) + " B " +
         (p.in_place ? "in place"
          : p.local  ? "local"
                     : "remote") +
         "\n";
  }
  for (const auto& [from, to, bytes] : link_bytes) {
    s += "  link " + std::to_string(from) + "->" + std::to_string(to) + ": " +
         std::to_string(bytes) + " B\n";
  }
  return s;
}

reshard_plan plan_reshard(const std::vector<chunk_ref>& src, const std::vector<chunk_ref>& dst,
                          const plan_options& options) {
  if (options.element_size == 0) {
    throw invalid_index_map("plan_reshard: element_size 0 is not allowed");
  }
  if (options.element_size > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    throw invalid_index_map("plan_reshard: element_size " + std::to_string(options.element_size) +
                            " is too large");
  }
  check_ranks(src, dst);
  return plan_builder(src, dst, options).build();
}

// --- plan_cache ---

plan_cache::plan_cache(std::size_t capacity) : capacity_(std::max<std::size_t>(capacity, 1)) {}

std::shared_ptr<const reshard_plan> plan_cache::find(const std::vector<chunk_ref>& src,
                                                     const shape_t& shape, const index_map& dst,
                                                     bool covering, const plan_options& options) {
  const std::uint64_t h = hash_key(src, shape, dst, covering, options);
  const std::lock_guard lock(mutex_);
  for (entry& e : entries_) {
    if (e.hash == h && same_key(e.key, src, shape, dst, covering, options)) {
      e.last_used = ++clock_;
      ++hits_;
      return e.plan;
    }
  }
  ++misses_;
  return nullptr;
}

void plan_cache::insert(plan_key key, std::shared_ptr<const reshard_plan> plan) {
  const std::uint64_t h = hash_key(key.src, key.shape, key.dst, key.covering, key.options);
  const std::lock_guard lock(mutex_);
  entry* slot = nullptr;
  for (entry& e : entries_) {
    if (e.hash == h && same_key(e.key, key.src, key.shape, key.dst, key.covering, key.options)) {
      slot = &e;  // planned twice concurrently: keep one
      break;
    }
  }
  if (slot == nullptr && entries_.size() < capacity_) {
    slot = &entries_.emplace_back();
  }
  if (slot == nullptr) {
    slot = &*std::min_element(entries_.begin(), entries_.end(), [](const entry& a, const entry& b) {
      return a.last_used < b.last_used;
    });
  }
  slot->hash = h;
  slot->last_used = ++clock_;
  slot->key = std::move(key);
  slot->plan = std::move(plan);
}

void plan_cache::clear() {
  const std::lock_guard lock(mutex_);
  entries_.clear();
}

plan_cache_stats plan_cache::stats() const {
  const std::lock_guard lock(mutex_);
  return {hits_, misses_, entries_.size()};
}

std::vector<std::vector<box>> owned_regions(const std::vector<chunk_ref>& chunks) {
  std::vector<std::vector<box>> owned;
  owned.reserve(chunks.size());
  std::vector<box> before;
  before.reserve(chunks.size());
  for (const chunk_ref& c : chunks) {
    owned.push_back(subtract_all(c.region, before));
    before.push_back(c.region);
  }
  return owned;
}

}  // namespace poolscope::darray
