#include "poolscope/darray/planner.hpp"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "box_index.hpp"

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

// The chunks of a list grouped by device, each group indexed by its boxes: which chunks of one
// device meet a box, without visiting the device's other chunks or other devices' chunks.
class chunks_by_device {
 public:
  explicit chunks_by_device(const std::vector<chunk_ref>& list) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      groups_[list[i].device].members.push_back(i);
    }
    for (auto& [device, g] : groups_) {
      g.index = detail::box_index(
          g.members.size(), [&](std::size_t k) -> const box& { return list[g.members[k]].region; });
    }
  }

  // Appends to `out` (cleared first) the chunks of `device` whose boxes may meet `q`, in
  // increasing order of their position in the list. Returns the nodes and boxes visited.
  std::uint64_t meeting(int device, const box& q, std::vector<std::size_t>& out) const {
    out.clear();
    const auto g = groups_.find(device);
    if (g == groups_.end()) {
      return 0;
    }
    found_.clear();
    const std::uint64_t visited = g->second.index.candidates(q, found_);
    for (const std::uint32_t k : found_) {
      out.push_back(g->second.members[k]);
    }
    std::sort(out.begin(), out.end());
    return visited;
  }

 private:
  struct group {
    std::vector<std::size_t> members;  // positions in list_, increasing
    detail::box_index index;           // over the members' boxes
  };
  std::map<int, group> groups_;
  mutable std::vector<std::uint32_t> found_;
};

// Builds the pieces of one plan; see plan_reshard. Every search for the chunks meeting a box goes
// through an index (box_index.hpp), so planning costs O(pieces log chunks) for maps whose chunks
// tile the array, not O(src * dst).
class plan_builder {
 public:
  plan_builder(const std::vector<chunk_ref>& src, const std::vector<chunk_ref>& dst,
               const plan_options& options)
      : src_(src),
        dst_(dst),
        options_(options),
        element_size_(static_cast<std::int64_t>(options.element_size)),
        received_(dst.size()),
        src_index_(src.size(), [&](std::size_t i) -> const box& { return src[i].region; }),
        src_on_device_(src),
        dst_on_device_(dst) {
    visited_ = src.size() + 2 * dst.size();
    src_disjoint_ = !options.accumulate && sources_disjoint();
    feeds_later_.assign(dst.size(), 0);
    std::vector<std::size_t> meeting;
    for (std::size_t j = 0; j < dst.size(); ++j) {
      visited_ += dst_on_device_.meeting(dst[j].device, dst[j].region, meeting);
      for (const std::size_t k : meeting) {
        if (k > j && intersect(dst[j].region, dst[k].region)) {
          feeds_later_[j] = 1;
          break;
        }
      }
    }
  }

  reshard_plan build() {
    reserve_pieces();
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
  // Makes room for the pieces the plan will likely have: a source chunk per destination chunk it
  // meets (exact for chunks that tile the array, and at most that for disjoint sources), so that
  // a plan of millions of pieces is not grown by copies (each holding the list twice).
  void reserve_pieces() {
    if (!src_disjoint_ && !options_.accumulate) {
      return;
    }
    std::size_t likely = 0;
    for (const chunk_ref& d : dst_) {
      found_.clear();
      visited_ += src_index_.candidates(d.region, found_);
      likely += found_.size();
    }
    remote_.reserve(likely);
  }

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
      if (!options_.accumulate && feeds_later_[j] != 0) {
        received_[j].push_back(p.region);
      }
    }
    if (p.local) {
      local_.push_back(std::move(p));
    } else {
      remote_.push_back(std::move(p));
    }
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
    found_.clear();
    visited_ += src_index_.candidates(dst_[j].region, found_);
    std::sort(found_.begin(), found_.end());
    for (const std::uint32_t i : found_) {
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
  void carve(std::vector<box>& rest, const box& holder, Take&& take) {
    std::vector<box> next;
    visited_ += rest.size();
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
  // Chunks whose boxes do not meet the destination chunk's would take nothing: the indexes leave
  // them out, and the others go in list order.
  void plan_replica(std::size_t j) {
    const int device = dst_[j].device;
    std::vector<std::size_t> locals;
    visited_ += src_on_device_.meeting(device, dst_[j].region, locals);
    std::stable_partition(locals.begin(), locals.end(), [&](std::size_t i) {
      return same_elements(src_[i].region, dst_[j].region);
    });
    std::vector<box> rest{dst_[j].region};
    for (const std::size_t i : locals) {
      take_from(i, j, rest);
    }
    if (!rest.empty()) {
      std::vector<std::size_t> earlier;
      visited_ += dst_on_device_.meeting(device, dst_[j].region, earlier);
      for (const std::size_t k : earlier) {
        if (k >= j || rest.empty()) {
          break;
        }
        if (!received_[k].empty()) {
          take_received(k, j, rest);
        }
      }
    }
    if (src_disjoint_) {
      take_sole_holders(j, rest);
    } else {
      take_least_loaded(j, rest);
    }
  }

  // The rest of destination chunk j when no two source chunks share an element: every element has
  // one holder, so whatever the loads, each part of `rest` a source chunk holds comes from that
  // chunk, in one piece per part of `rest` and chunk (take_least_loaded, which carves the parts
  // holder by holder, may cut a chunk's share where an earlier holder's was cut out: the same
  // elements in as many pieces or more, at O(h^2) for h holders).
  void take_sole_holders(std::size_t j, const std::vector<box>& rest) {
    for (const box& r : rest) {
      found_.clear();
      visited_ += src_index_.candidates(r, found_);
      std::sort(found_.begin(), found_.end());
      for (const std::uint32_t i : found_) {
        if (std::optional<box> c = intersect(r, src_[i].region)) {
          emit(i, j, std::move(*c));
        }
      }
    }
  }

  // The rest of destination chunk j from replicated sources: a region goes to the least-loaded
  // device among those holding any of it; what that device does not hold goes back to the front
  // of the queue. Every element so comes from the least-loaded of its own holders, and each round
  // removes a holder, so the loop ends. Each round queries the holders of its region: O(h^2) for a
  // region of h holders (the choice depends on loads that change as pieces are taken).
  void take_least_loaded(std::size_t j, const std::vector<box>& rest) {
    const int device = dst_[j].device;
    std::deque<box> queue(rest.begin(), rest.end());
    std::vector<std::size_t> holders;
    while (!queue.empty()) {
      const box r = std::move(queue.front());
      queue.pop_front();
      std::optional<int> chosen;
      found_.clear();
      visited_ += src_index_.candidates(r, found_);
      for (const std::uint32_t i : found_) {
        const chunk_ref& s = src_[i];
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
      visited_ += src_on_device_.meeting(*chosen, r, holders);
      for (const std::size_t i : holders) {
        take_from(i, j, parts);
      }
      queue.insert(queue.begin(), parts.begin(), parts.end());
    }
  }

  // Whether no two source chunks share an element (one index query per chunk; stops at the first
  // pair that does).
  bool sources_disjoint() {
    for (std::size_t i = 0; i < src_.size(); ++i) {
      found_.clear();
      visited_ += src_index_.candidates(src_[i].region, found_);
      for (const std::uint32_t k : found_) {
        if (k != i && intersect(src_[i].region, src_[k].region)) {
          return false;
        }
      }
    }
    return true;
  }

  // The remote pieces after splitting, in the order they were found (remote_ is released).
  std::vector<piece> split_remote() {
    const bool splits = options_.split_bytes > 0 &&
                        std::any_of(remote_.begin(), remote_.end(),
                                    [&](const piece& p) { return p.bytes > options_.split_bytes; });
    if (!splits) {
      return std::move(remote_);
    }
    std::vector<piece> remote;
    remote.reserve(remote_.size());
    std::vector<box> parts;
    for (piece& p : remote_) {
      if (p.bytes <= options_.split_bytes) {
        remote.push_back(std::move(p));
        continue;
      }
      parts.clear();
      split_region(p.region, element_size_, options_.split_bytes, parts);
      for (box& part : parts) {
        piece q = p;
        q.bytes = part.size() * element_size_;
        q.region = std::move(part);
        remote.push_back(std::move(q));
      }
    }
    std::vector<piece>().swap(remote_);
    return remote;
  }

  // Each from_dst piece cut along the remote pieces (after splitting) of the chunk it takes from:
  // (k, cut) for each cut that follows remote[k], by increasing k, in from_dst_ order for one k.
  std::vector<std::pair<std::size_t, piece>> cut_from_dst(const std::vector<piece>& remote) {
    std::vector<std::pair<std::size_t, piece>> after;
    if (from_dst_.empty()) {
      return after;
    }
    std::vector<std::vector<std::size_t>> remote_into(dst_.size());
    for (std::size_t k = 0; k < remote.size(); ++k) {
      remote_into[remote[k].dst_chunk].push_back(k);
    }
    std::vector<std::vector<std::size_t>> reading(dst_.size());  // from_dst pieces by chunk read
    for (std::size_t m = 0; m < from_dst_.size(); ++m) {
      reading[from_dst_[m].src_chunk].push_back(m);
    }
    for (std::size_t c = 0; c < dst_.size(); ++c) {
      const auto& into = remote_into[c];
      const auto& readers = reading[c];
      visited_ += detail::for_each_meeting(
          into.size(), [&](std::size_t i) -> const box& { return remote[into[i]].region; },
          readers.size(), [&](std::size_t m) -> const box& { return from_dst_[readers[m]].region; },
          [&](std::size_t i, std::size_t m, box common) {
            piece q = from_dst_[readers[m]];
            q.bytes = common.size() * element_size_;
            q.region = std::move(common);
            after.emplace_back(into[i], std::move(q));
          });
    }
    // Found by reader (from_dst_ order) within each chunk: a stable sort by k keeps that order.
    std::stable_sort(after.begin(), after.end(),
                     [](const auto& l, const auto& r) { return l.first < r.first; });
    return after;
  }

  // The issue order of the remote pieces (see the file comment of planner.hpp).
  std::vector<std::size_t> remote_order(
      const std::vector<piece>& remote,
      const std::vector<std::pair<std::size_t, piece>>& after) const {
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
    }
    for (const auto& [k, q] : after) {
      const auto at = position_of(q);
      if (earlier(at, position[k])) {
        position[k] = at;
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
    return order;
  }

  // The plan's pieces in issue order: local pieces first, then each remote piece by `order`, each
  // followed by its from_dst cuts. The local pieces and the cuts are appended to `remote`, which is
  // then permuted in place: a plan of millions of pieces is never held twice.
  std::vector<piece> ordered_pieces(std::vector<piece>& remote,
                                    std::vector<std::pair<std::size_t, piece>>& after,
                                    const std::vector<std::size_t>& order) {
    const std::size_t remotes = remote.size();
    const std::size_t locals = local_.size();
    std::vector<piece> all = std::move(remote);
    all.reserve(remotes + locals + after.size());
    all.insert(all.end(), std::make_move_iterator(local_.begin()),
               std::make_move_iterator(local_.end()));
    std::vector<piece>().swap(local_);
    // The cuts of remote piece k are after[first_cut[k], first_cut[k + 1]) (after is by k).
    std::vector<std::size_t> first_cut;
    if (!after.empty()) {
      first_cut.assign(remotes + 1, 0);
      for (auto& cut : after) {
        ++first_cut[cut.first + 1];
        all.push_back(std::move(cut.second));
      }
      for (std::size_t k = 0; k < remotes; ++k) {
        first_cut[k + 1] += first_cut[k];
      }
    }
    after.clear();
    // target[i]: where all[i] goes. Remote piece k is at k, local piece i at remotes + i, cut c at
    // remotes + locals + c.
    std::vector<std::size_t> target(all.size());
    for (std::size_t i = 0; i < locals; ++i) {
      target[remotes + i] = i;
    }
    std::size_t next = locals;
    for (const std::size_t k : order) {
      target[k] = next++;
      if (!first_cut.empty()) {
        for (std::size_t c = first_cut[k]; c < first_cut[k + 1]; ++c) {
          target[remotes + locals + c] = next++;
        }
      }
    }
    // Cycles of the permutation: each swap puts one piece where it belongs.
    for (std::size_t i = 0; i < all.size(); ++i) {
      while (target[i] != i) {
        const std::size_t t = target[i];
        std::swap(all[i], all[t]);
        std::swap(target[i], target[t]);
      }
    }
    return all;
  }

  reshard_plan finish() {
    std::vector<piece> remote = split_remote();
    std::vector<std::pair<std::size_t, piece>> after = cut_from_dst(remote);
    const std::vector<std::size_t> order = remote_order(remote, after);
    reshard_plan plan;
    plan.pieces = ordered_pieces(remote, after, order);
    plan.pieces_of_dst.resize(dst_.size());
    // (src device, dst device, bytes) of every remote piece, summed per link after sorting.
    std::vector<std::tuple<int, int, std::int64_t>> links;
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
        links.emplace_back(p.src_device, p.dst_device, p.bytes);
      }
    }
    std::sort(links.begin(), links.end());
    for (const auto& [from, to, bytes] : links) {
      if (!plan.link_bytes.empty() && std::get<0>(plan.link_bytes.back()) == from &&
          std::get<1>(plan.link_bytes.back()) == to) {
        std::get<2>(plan.link_bytes.back()) += bytes;
      } else {
        plan.link_bytes.emplace_back(from, to, bytes);
      }
    }
    visited_ += plan.pieces.size();
    plan.boxes_visited = visited_;
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
  // Per destination chunk: a later destination chunk on its device meets it (so what it
  // receives is kept in received_ for take_received).
  std::vector<char> feeds_later_;
  std::map<int, std::int64_t> load_;  // remote bytes assigned to each source device so far
  detail::box_index src_index_;       // every source chunk
  chunks_by_device src_on_device_;
  chunks_by_device dst_on_device_;
  std::vector<std::uint32_t> found_;  // scratch of src_index_ queries
  std::uint64_t visited_ = 0;         // reshard_plan::boxes_visited
  bool src_disjoint_ = false;         // no element has two holders (sources_disjoint)
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
  // Chunk i loses only the earlier chunks whose boxes meet its own: subtracting the others
  // changes nothing, and an index finds the meeting ones without visiting every pair.
  const detail::box_index index(chunks.size(),
                                [&](std::size_t i) -> const box& { return chunks[i].region; });
  std::vector<std::vector<box>> owned;
  owned.reserve(chunks.size());
  std::vector<std::uint32_t> found;
  std::vector<box> before;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    found.clear();
    static_cast<void>(index.candidates(chunks[i].region, found));
    std::sort(found.begin(), found.end());
    before.clear();
    for (const std::uint32_t k : found) {
      if (k >= i) {
        break;
      }
      before.push_back(chunks[k].region);
    }
    owned.push_back(subtract_all(chunks[i].region, before));
  }
  return owned;
}

}  // namespace poolscope::darray
