// The reshard executor (reshard_executor.hpp): plans through the backend's cache, then enqueues
// each piece (or one transfer group) with its own event.
#include "reshard_executor.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "box_index.hpp"
#include "poolscope/error.hpp"
#include "poolscope/profiler/scope.hpp"

namespace poolscope::darray::detail {

namespace {

using profiler::category;

// The plan of resharding `src` into `dst_map`: the backend's cached one, or a new one (after
// checking the map as `check` says) that the cache then keeps.
std::shared_ptr<const reshard_plan> plan_for(const array_state& src,
                                             const darray::index_map& dst_map,
                                             const std::vector<chunk>& dst_chunks, map_check check,
                                             const plan_options& po) {
  backend& be = *src.be;
  const bool covering = check != map_check::bounds;
  auto src_refs = refs_of(src.chunks);
  if (auto cached = be.plans().find(src_refs, src.shape, dst_map, covering, po)) {
    return cached;
  }
  if (check != map_check::none) {
    dst_map.validate(src.shape, be.device_count(), covering);
  }
  auto plan = std::make_shared<const reshard_plan>(plan_reshard(src_refs, refs_of(dst_chunks), po));
  be.plans().insert(plan_key{std::move(src_refs), src.shape, dst_map, covering, po}, plan);
  return plan;
}

// What each piece of a plan reads from its source chunk: the parts of the chunk its region meets,
// with the region of each, in part order. A chunk of few parts is scanned by each piece reading
// it (no allocation: most arrays have a part per chunk); for a chunk of many, the parts every
// piece reads are found up front through for_each_meeting (an index of the chunk's parts), so a
// chunk of P parts read by Q pieces costs O((P + Q) log P + the parts read), not P * Q. from_dst
// pieces read destination chunks: nothing here.
class source_parts {
 public:
  source_parts(const array_state& src, const reshard_plan& plan) : src_(src), plan_(plan) {
    if (std::none_of(src.chunks.begin(), src.chunks.end(),
                     [](const chunk& c) { return c.parts.size() > few_parts; })) {
      return;
    }
    std::vector<std::vector<std::size_t>> readers(src.chunks.size());
    for (std::size_t m = 0; m < plan.pieces.size(); ++m) {
      const piece& p = plan.pieces[m];
      if (!p.from_dst && src.chunks[p.src_chunk].parts.size() > few_parts) {
        readers[p.src_chunk].push_back(m);
      }
    }
    // (piece, read) in the order found, then placed piece by piece (a counting sort: stable).
    std::vector<std::pair<std::size_t, read>> found;
    for (std::size_t c = 0; c < readers.size(); ++c) {
      const auto& parts = src.chunks[c].parts;
      const auto& mine = readers[c];
      visited_ += for_each_meeting(
          parts.size(), [&](std::size_t i) -> const box& { return parts[i].region; }, mine.size(),
          [&](std::size_t k) -> const box& { return plan.pieces[mine[k]].region; },
          [&](std::size_t i, std::size_t k, box common) {
            found.emplace_back(mine[k], read{i, std::move(common)});
          });
    }
    begin_.assign(plan.pieces.size() + 1, 0);
    for (const auto& f : found) {
      ++begin_[f.first + 1];
    }
    for (std::size_t m = 0; m < plan.pieces.size(); ++m) {
      begin_[m + 1] += begin_[m];
    }
    std::vector<std::size_t> next(begin_.begin(), begin_.end() - 1);
    reads_.resize(found.size());
    for (auto& f : found) {
      reads_[next[f.first]++] = std::move(f.second);
    }
  }

  /// Calls f(part, region) for each part of its source chunk that piece `m` reads, in part order.
  template <typename F>
  void visit(std::size_t m, F&& f) {
    const piece& p = plan_.pieces[m];
    const auto& parts = src_.chunks[p.src_chunk].parts;
    if (parts.size() > few_parts) {
      for (std::size_t r = begin_[m]; r < begin_[m + 1]; ++r) {
        f(reads_[r].part, reads_[r].region);
      }
      return;
    }
    visited_ += parts.size();
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (std::optional<box> common = intersect(parts[i].region, p.region)) {
        f(i, *common);
      }
    }
  }
  /// The most parts piece `m` may read (exactly those it reads, for a chunk of many parts).
  [[nodiscard]] std::size_t reads_at_most(std::size_t m) const {
    const std::size_t parts = src_.chunks[plan_.pieces[m].src_chunk].parts.size();
    return parts > few_parts ? begin_[m + 1] - begin_[m] : parts;
  }
  /// The parts, pieces and index nodes visited so far.
  [[nodiscard]] std::uint64_t visited() const noexcept { return visited_; }

 private:
  // Chunks of at most this many parts are scanned by each piece.
  static constexpr std::size_t few_parts = 8;
  struct read {
    std::size_t part;
    box region;
  };
  const array_state& src_;
  const reshard_plan& plan_;
  std::vector<std::size_t> begin_;  // piece m's reads are reads_[begin_[m], begin_[m + 1])
  std::vector<read> reads_;
  std::uint64_t visited_ = 0;
};

// Makes room in each destination chunk of `out` for the parts the plan's pieces bring (at most one
// per part read; a from_dst piece at most one per part of the piece it follows): a chunk of many
// parts would otherwise grow its list by copies.
void reserve_parts(array_state& out, const reshard_plan& plan, const source_parts& reads) {
  std::vector<std::size_t> count(out.chunks.size(), 0);
  std::size_t last_sent_reads = 0;
  for (std::size_t m = 0; m < plan.pieces.size(); ++m) {
    const piece& p = plan.pieces[m];
    if (!p.from_dst) {
      last_sent_reads = reads.reads_at_most(m);
    }
    count[p.dst_chunk] += p.from_dst ? last_sent_reads : reads.reads_at_most(m);
  }
  for (std::size_t j = 0; j < out.chunks.size(); ++j) {
    out.chunks[j].parts.reserve(count[j]);
  }
}

// The parts [first, last) of a destination chunk that one piece of the plan added.
using part_range = std::pair<std::size_t, std::size_t>;

// Checks that from_dst piece `m` reads what piece `last_sent` (the last piece before it that is
// not from_dst) brought: the plan puts each from_dst piece right after the remote piece whose
// received parts it takes, into the chunk the from_dst piece names. Throws logic_error for a plan
// that breaks that order.
void check_follows(const reshard_plan& plan, std::size_t m, std::size_t last_sent) {
  const piece& p = plan.pieces[m];
  if (last_sent >= m || plan.pieces[last_sent].dst_chunk != p.src_chunk) {
    throw logic_error("darray reshard: plan piece " + std::to_string(m) +
                      " takes from destination chunk " + std::to_string(p.src_chunk) +
                      ", which the piece before it does not fill");
  }
}

// Adds to `dst` the parts `added` of `from`, an earlier destination chunk of the same reshard on
// the same device, inside `region` (a from_dst piece): what crossed to the device once, into
// `from`, is read where it landed (no copy), each part ready when its piece has arrived. `added`
// are the parts the piece the from_dst piece follows brought (check_follows): the only ones its
// region meets. Returns the parts visited.
std::uint64_t alias_received(const chunk& from, part_range added, const box& region, chunk& dst) {
  for (std::size_t i = added.first; i < added.second; ++i) {
    const chunk_part& q = from.parts[i];
    auto r = intersect(q.region, region);
    if (r && !r->empty()) {
      dst.parts.push_back(chunk_part{*r, q.storage, q.storage_box, q.ready});
    }
  }
  return added.second - added.first;
}

// The elements `region` of a source chunk `from` on this process's device that piece `m` reads,
// as one contiguous view there for a transfer to another rank: the part's own memory when one
// part holds them contiguously, else packed into a new dense buffer (`packed`) on the device's
// transfer queue. That queue first waits for every part read; their buffers are added to `read`.
view outgoing_region(backend& be, dtype t, const chunk& from, source_parts& reads, std::size_t m,
                     const box& region, std::shared_ptr<buffer>& packed,
                     std::vector<std::shared_ptr<buffer>>& read) {
  const int d = from.device;
  std::vector<std::pair<const chunk_part*, box>> pieces;
  reads.visit(m, [&](std::size_t part, const box& r) {
    const chunk_part& q = from.parts[part];
    be.wait(d, queue_kind::transfer, q.ready);
    read.push_back(q.storage);
    pieces.emplace_back(&q, r);
  });
  if (pieces.size() == 1 && pieces.front().second == region) {
    const view whole = view_of(*pieces.front().first, region);
    if (whole.contiguous()) {
      return whole;
    }
  }
  packed = dense_buffer(be, d, region, t);
  for (const auto& [q, r] : pieces) {
    be.copy(d, queue_kind::transfer, t, view::of_box(packed->data(), region, r), d, view_of(*q, r),
            d);
  }
  return view::dense(packed->data(), region.extents());
}

// Which side of piece `p` this process holds: both (a copy within the process), the source
// only (a send to another rank), the destination only (a receive), or neither (another rank's
// piece: nothing to do here).
enum class side : std::uint8_t { both, source, destination, neither };
side side_of(const backend& be, const piece& p) {
  const bool src = be.is_local(p.src_device);
  const bool dst = be.is_local(p.dst_device);
  return src && dst ? side::both : src ? side::source : dst ? side::destination : side::neither;
}

// The remote pieces of a replica-mode reshard as one backend::copy_group (NCCL: one grouped
// call, every link at once, those with other ranks too). NCCL moves contiguous bytes only, so a
// strided side goes through a dense staging buffer: packed on the sender's transfer queue before
// the group, unpacked on the receiver's after it. Every piece is complete when its receiver's
// transfer queue passes the group (no piece can be computed on earlier). Local pieces alias the
// source, as piece by piece, and from_dst pieces the received parts of their destination chunk
// once the group is issued. A piece with another rank is one transfer of its whole region (that
// rank does not know this one's parts); one between two other ranks is theirs alone.
template <typename DenseOf>
void send_as_group(const array_state& src, array_state& out, const reshard_plan& plan,
                   transport how, DenseOf&& dense_of) {
  static const profiler::scope_site group_site{"darray.transfer_group", category::darray_transfer};
  const profiler::scope group_scope{group_site};
  backend& be = *src.be;
  source_parts reads(src, plan);
  reserve_parts(out, plan, reads);
  std::vector<part_range> added(plan.pieces.size());
  // One per transfer of the group (same index): what its ends hold on to, and (received here)
  // the part it makes.
  struct arrival {
    std::size_t piece;
    std::size_t dst_chunk;
    box region;
    std::shared_ptr<buffer> target;                // null: not received here
    std::vector<std::shared_ptr<buffer>> sources;  // the sender's storage read (sent from here)
    std::shared_ptr<buffer> packed;                // the piece packed densely, or null
    std::shared_ptr<buffer> received;              // staging to unpack from, or null
    view unpack_to;
  };
  std::vector<arrival> arrivals;
  std::vector<backend::transfer> group;
  // The landing view of a piece (or part) received here, through staging when strided.
  const auto landing_of = [&](arrival& a, const chunk& dst) {
    view landing = view::of_box(a.target->data(), dst.region, a.region);
    if (!landing.contiguous()) {
      a.received = dense_buffer(be, dst.device, a.region, src.type);
      a.unpack_to = landing;
      landing = view::dense(a.received->data(), a.region.extents());
    }
    return landing;
  };
  for (std::size_t m = 0; m < plan.pieces.size(); ++m) {
    const piece& p = plan.pieces[m];
    const side mine = side_of(be, p);
    if (p.from_dst || mine == side::neither) {
      continue;  // from_dst: after the group (the parts it reads are made there)
    }
    chunk& dst = out.chunks[p.dst_chunk];
    const chunk& from = src.chunks[p.src_chunk];
    if (mine == side::source) {
      arrival a{m, p.dst_chunk, p.region, nullptr, {}, nullptr, nullptr, {}};
      const view sent =
          outgoing_region(be, src.type, from, reads, m, p.region, a.packed, a.sources);
      group.push_back(backend::transfer{view{}, dst.device, sent, from.device});
      arrivals.push_back(std::move(a));
      continue;
    }
    if (mine == side::destination) {
      arrival a{m, p.dst_chunk, p.region, dense_of(p.dst_chunk), {}, nullptr, nullptr, {}};
      group.push_back(backend::transfer{landing_of(a, dst), dst.device, view{}, from.device});
      arrivals.push_back(std::move(a));
      continue;
    }
    reads.visit(m, [&](std::size_t part, const box& region) {
      const chunk_part& q = from.parts[part];
      if (p.local) {
        dst.parts.push_back(chunk_part{region, q.storage, q.storage_box, q.ready});
        return;
      }
      arrival a{m, p.dst_chunk, region, dense_of(p.dst_chunk), {q.storage}, nullptr, nullptr, {}};
      view sent = view_of(q, region);
      be.wait(from.device, queue_kind::transfer, q.ready);
      if (!sent.contiguous()) {
        a.packed = dense_buffer(be, from.device, region, src.type);
        const view packed = view::dense(a.packed->data(), region.extents());
        be.copy(from.device, queue_kind::transfer, src.type, packed, from.device, sent,
                from.device);
        sent = packed;
      }
      group.push_back(backend::transfer{landing_of(a, dst), dst.device, sent, from.device});
      arrivals.push_back(std::move(a));
    });
  }
  be.copy_group(src.type, group, how);
  for (std::size_t i = 0; i < arrivals.size(); ++i) {
    const arrival& a = arrivals[i];
    if (a.received) {
      const int d = group[i].dst_device;
      be.copy(d, queue_kind::transfer, src.type, a.unpack_to, d, group[i].dst, d);
    }
  }
  // One event per device of this process involved, after the group (and the unpacks) on its
  // transfer queue.
  std::map<int, event> after;
  for (const auto& x : group) {
    for (const int d : {x.src_device, x.dst_device}) {
      if (be.is_local(d) && after.find(d) == after.end()) {
        after.emplace(d, be.record(d, queue_kind::transfer));
      }
    }
  }
  for (std::size_t i = 0; i < arrivals.size(); ++i) {
    const arrival& a = arrivals[i];
    if (!a.sources.empty()) {
      const event& sent = after.at(group[i].src_device);
      for (const auto& b : a.sources) {
        b->add_use(sent);
      }
      if (a.packed) {
        a.packed->add_use(sent);
      }
    }
    if (!a.target) {
      continue;  // sent to another rank
    }
    const event& arrived = after.at(group[i].dst_device);
    a.target->add_use(arrived);
    if (a.received) {
      a.received->add_use(arrived);
    }
    auto& parts = out.chunks[a.dst_chunk].parts;
    // A piece's arrivals are consecutive, and so are the parts they add to its chunk.
    if (i == 0 || arrivals[i - 1].piece != a.piece) {
      added[a.piece].first = parts.size();
    }
    parts.push_back(chunk_part{a.region, a.target, out.chunks[a.dst_chunk].region, arrived});
    added[a.piece].second = parts.size();
    ++out.info.transfers;
  }
  std::uint64_t visited = reads.visited() + plan.pieces.size();
  std::size_t last_sent = plan.pieces.size();
  for (std::size_t m = 0; m < plan.pieces.size(); ++m) {
    const piece& p = plan.pieces[m];
    if (!p.from_dst) {
      last_sent = m;
      continue;
    }
    if (!be.is_local(p.dst_device)) {
      continue;  // another rank's
    }
    check_follows(plan, m, last_sent);
    visited += alias_received(out.chunks[p.src_chunk], added[last_sent], p.region,
                              out.chunks[p.dst_chunk]);
  }
  be.count_parts_visited(visited);
}

// This rank's side of piece `p` whose destination is another rank's: its region sent whole, on
// the transfer queue of the source chunk `from`'s device.
void send_piece(backend& be, dtype t, const chunk& from, source_parts& reads, std::size_t m,
                const piece& p) {
  std::shared_ptr<buffer> packed;
  std::vector<std::shared_ptr<buffer>> read;
  const view sent = outgoing_region(be, t, from, reads, m, p.region, packed, read);
  be.send(from.device, t, sent, p.dst_device);
  const event e = be.record(from.device, queue_kind::transfer);
  for (const auto& b : read) {
    b->add_use(e);
  }
  if (packed) {
    packed->add_use(e);
  }
}

// This rank's side of piece `p` whose source is another rank's: its region received whole on
// the transfer queue of `dst`'s device, into `target` (dst's dense buffer) or, where the region
// is strided there, into staging unpacked on the same queue. Returns the part it makes.
chunk_part receive_piece(backend& be, dtype t, const chunk& dst,
                         const std::shared_ptr<buffer>& target, const piece& p) {
  const int d = dst.device;
  const view landing = view::of_box(target->data(), dst.region, p.region);
  std::shared_ptr<buffer> staging;
  if (landing.contiguous()) {
    be.receive(d, t, landing, p.src_device);
  } else {
    staging = dense_buffer(be, d, p.region, t);
    const view staged = view::dense(staging->data(), p.region.extents());
    be.receive(d, t, staged, p.src_device);
    be.copy(d, queue_kind::transfer, t, landing, d, staged, d);
  }
  const event e = be.record(d, queue_kind::transfer);
  target->add_use(e);
  if (staging) {
    staging->add_use(e);
  }
  return chunk_part{p.region, target, dst.region, e};
}

// A partial source's piece from another rank: received whole into staging on the transfer queue
// of `dst`'s device, then combined into `acc` (the piece's region of dst's dense buffer) on its
// compute queue. Returns the staging buffer (the compute's last use of it is recorded later).
std::shared_ptr<buffer> receive_contribution(backend& be, dtype t, reduce_op op, const chunk& dst,
                                             const view& acc, const piece& p) {
  const int d = dst.device;
  auto staging = dense_buffer(be, d, p.region, t);
  const view staged = view::dense(staging->data(), p.region.extents());
  be.receive(d, t, staged, p.src_device);
  be.wait(d, queue_kind::compute, be.record(d, queue_kind::transfer));
  be.accumulate(d, queue_kind::compute, t, op, acc, staged);
  return staging;
}

// Remote pieces of at most this many bytes are copied on the receiver's compute queue (the CUDA
// backend's copy-kernel size, cuda_backend.cpp): a cross-device event and wait cost a small fused
// op more than overlapping the copy gains (docs/perf.md, "Small pieces pulled by the receiver").
constexpr std::int64_t pull_on_compute_bytes = std::int64_t{64} << 10;

}  // namespace

// Runs the plan of a reshard of `src` into `dst_map`, returning the new state. A map not planned
// for before is first checked as `check` says.
// `in_place` (optional; replica sources moved piece by piece only) is called once, as soon as
// every queue that copies a piece (not a pulled one) has its first copy enqueued, or at the end:
// so compute on the data already in place (a fused op's) is enqueued while the first copies
// run, instead of after the host has issued every piece (the later pieces queue behind those
// copies anyway, which take far longer than their issue), and, with every piece issued, still
// before the compute on what the pieces bring. The plan puts local pieces first, so their parts
// are each chunk's first.
std::shared_ptr<array_state> execute_reshard(const array_state& src,
                                             const darray::index_map& dst_map,
                                             const reshard_options& options, map_check check,
                                             const in_place_ready& in_place) {
  static const profiler::scope_site reshard_site{"darray.reshard", category::darray_transfer};
  static const profiler::scope_site piece_site{"darray.piece", category::darray_transfer};
  const profiler::scope op_scope{reshard_site};
  backend& be = *src.be;
  const bool accumulate = src.mode != array_mode::replica;
  plan_options po;
  po.element_size = size_of(src.type);
  // A group's pieces are not split: nothing computes on a part before the whole group lands, and
  // NCCL moves one large send per link faster than several (docs/darray.md "Transports").
  po.split_bytes = options.how == transport::nccl ? 0 : options.split_bytes;
  po.accumulate = accumulate;
  auto out = std::make_shared<array_state>();
  out->be = src.be;
  out->type = src.type;
  out->shape = src.shape;
  out->map = dst_map;
  out->mode = array_mode::replica;
  out->chunks = chunks_of(dst_map);
  out->info.plan = plan_for(src, dst_map, out->chunks, check, po);
  // Whether the backend moves the remote pieces as one group (always with nccl; with automatic
  // its choice, as a CUDA backend makes for pieces between ranks). A plan it groups is made again
  // whole, for the reason above.
  const bool grouped = !accumulate && be.groups_transfers(*out->info.plan, options.how);
  if (grouped && po.split_bytes > 0) {
    po.split_bytes = 0;
    out->info.plan = plan_for(src, dst_map, out->chunks, check, po);
  }
  const reshard_plan& plan = *out->info.plan;

  std::vector<std::shared_ptr<buffer>> dense(out->chunks.size());
  // Destination chunks written only by pulls on their device's compute queue (set below).
  std::vector<char> pulled_only;
  auto dense_of = [&](std::size_t j) -> const std::shared_ptr<buffer>& {
    if (!dense[j]) {
      const chunk& c = out->chunks[j];
      // Accumulated into on the compute queue (filled there first), or written there by pulls
      // alone: a buffer dropped with its uses pending on that queue may serve (stream order).
      const bool compute_first = accumulate || (j < pulled_only.size() && pulled_only[j] != 0);
      dense[j] = dense_buffer(be, c.device, c.region, src.type,
                              compute_first ? std::optional(queue_kind::compute) : std::nullopt);
      if (accumulate) {
        be.fill(c.device, queue_kind::compute, src.type,
                view::dense(dense[j]->data(), c.region.extents()),
                identity(op_of(src.mode), src.type));
      }
    }
    return dense[j];
  };

  if (grouped) {
    send_as_group(src, *out, plan, options.how, dense_of);
    return out;
  }

  // A small piece is pulled by the receiver on its compute queue, where the work that reads it
  // runs: no event between queues (or devices) to record and wait for, and on a GPU one copy
  // kernel's launch (a few microseconds of compute-queue time at most).
  // Pieces with other ranks are never pulled: they are received on the transfer queue.
  const auto pulled = [&be](const piece& p) {
    return p.bytes <= pull_on_compute_bytes && side_of(be, p) == side::both;
  };
  if (!accumulate) {
    // A chunk whose every remote piece is pulled is written by no other queue.
    pulled_only.assign(out->chunks.size(), 1);
    for (const piece& p : plan.pieces) {
      if (!p.local && !p.from_dst && !pulled(p)) {
        pulled_only[p.dst_chunk] = 0;
      }
    }
  }
  source_parts reads(src, plan);
  reserve_parts(*out, plan, reads);
  std::uint64_t visited = plan.pieces.size();
  // The last piece that was not from_dst, and the parts it added to its destination chunk: what
  // the from_dst pieces after it read.
  std::size_t last_sent = plan.pieces.size();
  part_range last_added{0, 0};
  std::vector<std::vector<std::shared_ptr<buffer>>> used(out->chunks.size());
  // For in_place: per device, whether its issuing queue copies a piece (1) and has one enqueued
  // (2); the queues still waiting for their first copy; each chunk's parts in place.
  std::vector<char> copying;
  std::size_t queues_waiting = 0;
  std::vector<std::size_t> local_parts;
  bool in_place_called = accumulate || !in_place;
  // (A piece with another rank is issued by this rank's side of it.)
  const auto issuing_device = [&](const piece& p) {
    const side mine = side_of(be, p);
    const bool source =
        mine == side::both ? options.issue_on == copy_queue::source : mine == side::source;
    return static_cast<std::size_t>(source ? p.src_device : p.dst_device);
  };
  const auto copied = [&](const piece& p) {
    return !p.local && !p.from_dst && !pulled(p) && side_of(be, p) != side::neither;
  };
  if (!in_place_called) {
    for (const piece& p : plan.pieces) {
      if (copied(p)) {
        const std::size_t qd = issuing_device(p);
        copying.resize(std::max(copying.size(), qd + 1), 0);
        if (copying[qd] == 0) {
          copying[qd] = 1;
          ++queues_waiting;
        }
      }
    }
  }
  const auto note_local_parts = [&] {
    if (local_parts.empty()) {
      local_parts.reserve(out->chunks.size());
      for (const chunk& c : out->chunks) {
        local_parts.push_back(c.parts.size());
      }
    }
  };
  const auto call_in_place = [&] {
    if (!in_place_called) {
      in_place_called = true;
      note_local_parts();
      in_place(*out, local_parts);
    }
  };
  const auto execute_piece = [&](std::size_t m) {
    const piece& p = plan.pieces[m];
    chunk& dst = out->chunks[p.dst_chunk];
    const side mine = side_of(be, p);
    if (p.from_dst) {
      if (mine != side::neither) {
        // The plan puts it after the piece it reads, so the parts it aliases are there.
        check_follows(plan, m, last_sent);
        visited += alias_received(out->chunks[p.src_chunk], last_added, p.region, dst);
      }
      return;
    }
    last_sent = m;
    last_added.first = dst.parts.size();
    last_added.second = last_added.first;
    if (mine == side::neither) {
      return;  // between other ranks
    }
    const chunk& from = src.chunks[p.src_chunk];
    if (mine != side::both) {
      const profiler::scope piece_scope{piece_site};
      if (mine == side::source) {
        send_piece(be, src.type, from, reads, m, p);
      } else if (!accumulate) {
        dst.parts.push_back(receive_piece(be, src.type, dst, dense_of(p.dst_chunk), p));
        last_added.second = dst.parts.size();
        ++out->info.transfers;
      } else {
        const view acc = view::of_box(dense_of(p.dst_chunk)->data(), dst.region, p.region);
        used[p.dst_chunk].push_back(
            receive_contribution(be, src.type, op_of(src.mode), dst, acc, p));
        ++out->info.transfers;
      }
      return;
    }
    reads.visit(m, [&](std::size_t part, const box& region) {
      const chunk_part& q = from.parts[part];
      if (!accumulate && p.local) {
        // Already on the device: the new chunk reads the source's buffer (no copy).
        dst.parts.push_back(chunk_part{region, q.storage, q.storage_box, q.ready});
        return;
      }
      const int d = dst.device;
      // The queue that issues the copy: the sender's or the receiver's transfer queue.
      const int qd = options.issue_on == copy_queue::source ? from.device : d;
      if (!accumulate) {
        const profiler::scope piece_scope{piece_site};
        const auto& target = dense_of(p.dst_chunk);
        const bool pull = pulled(p);
        const int on = pull ? d : qd;
        const queue_kind via = pull ? queue_kind::compute : queue_kind::transfer;
        be.wait(on, via, q.ready);
        be.copy(on, via, src.type, view::of_box(target->data(), dst.region, region), d,
                view_of(q, region), from.device, options.how);
        const event e = be.record(on, via);
        q.storage->add_use(e);
        target->add_use(e);
        dst.parts.push_back(chunk_part{region, target, dst.region, e});
        ++out->info.transfers;
        return;
      }
      // Partial source: combine every contribution into the destination's dense buffer.
      const auto& target = dense_of(p.dst_chunk);
      const reduce_op op = op_of(src.mode);
      const view acc = view::of_box(target->data(), dst.region, region);
      if (p.local) {
        be.wait(d, queue_kind::compute, q.ready);
        be.accumulate(d, queue_kind::compute, src.type, op, acc, view_of(q, region));
        used[p.dst_chunk].push_back(q.storage);
      } else {
        const profiler::scope piece_scope{piece_site};
        auto staging = dense_buffer(be, d, region, src.type);
        const view staged = view::dense(staging->data(), region.extents());
        be.wait(qd, queue_kind::transfer, q.ready);
        be.copy(qd, queue_kind::transfer, src.type, staged, d, view_of(q, region), from.device,
                options.how);
        const event arrived = be.record(qd, queue_kind::transfer);
        q.storage->add_use(arrived);
        be.wait(d, queue_kind::compute, arrived);
        be.accumulate(d, queue_kind::compute, src.type, op, acc, staged);
        used[p.dst_chunk].push_back(std::move(staging));
        ++out->info.transfers;
      }
    });
    last_added.second = dst.parts.size();
  };
  for (std::size_t m = 0; m < plan.pieces.size(); ++m) {
    const piece& p = plan.pieces[m];
    bool last_first_copy = false;  // the last queue to start copying starts with this piece
    if (!in_place_called) {
      if (!p.local || p.from_dst) {
        note_local_parts();  // the local pieces are done
      }
      if (copied(p) && copying[issuing_device(p)] == 1) {
        copying[issuing_device(p)] = 2;
        last_first_copy = --queues_waiting == 0;
      }
    }
    execute_piece(m);
    if (last_first_copy) {
      call_in_place();
    }
  }
  call_in_place();
  be.count_parts_visited(visited + reads.visited());
  if (accumulate) {
    for (std::size_t j = 0; j < out->chunks.size(); ++j) {
      chunk& c = out->chunks[j];
      if (c.region.empty() || !be.is_local(c.device)) {
        continue;
      }
      const auto& target = dense_of(j);
      const event e = be.record(c.device, queue_kind::compute);
      target->add_use(e);
      for (const auto& u : used[j]) {
        u->add_use(e);
      }
      c.parts.push_back(chunk_part{c.region, target, c.region, e});
    }
  }
  return out;
}

// The state of `h`, completed to replica mode if it is partial.
std::shared_ptr<const array_state> completed(const std::shared_ptr<const array_state>& s) {
  if (s->mode == array_mode::replica) {
    return s;
  }
  return execute_reshard(*s, s->map.deduplicated(), {}, map_check::cover);
}

std::shared_ptr<const array_state> gathered(const std::shared_ptr<const array_state>& s) {
  const backend& be = *s->be;
  darray::index_map all;
  for (int r = 0; r < be.group()->size(); ++r) {
    all.add(be.first_device_of(r), box::full(s->shape));
  }
  if (s->mode == array_mode::replica && s->map == all) {
    return s;
  }
  return execute_reshard(*s, all, {}, map_check::none);
}

}  // namespace poolscope::darray::detail
