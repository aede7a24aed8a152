// The backend interface through the host backend: argument checks, strided views, reductions
// along axes, gemm with leading dimensions, ordering through events across devices.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "poolscope/darray/backend.hpp"
#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/error.hpp"
#include "test_support.hpp"

namespace poolscope::darray {
namespace {

std::vector<double> download(backend& be, int d, const view& v) {
  std::vector<double> out(static_cast<std::size_t>(v.size()));
  be.download(d, dtype::f64, view::dense(out.data(), v.extents()), v);
  return out;
}

TEST(darray_backend, specs_and_arguments_are_checked) {
  // Each message names the spec and says what is wrong with it.
  const auto message_of = [](const char* spec) {
    try {
      (void)make_backend(spec);
    } catch (const invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of("host:0").find("\"host:0\": the device count 0 is outside 1..64"),
            std::string::npos)
      << message_of("host:0");
  EXPECT_NE(message_of("host:x").find("\"host:x\": the device count 'x' is not a whole number"),
            std::string::npos)
      << message_of("host:x");
  EXPECT_NE(message_of("cuda:0").find("\"cuda:0\": the device count 0 is outside 1..64"),
            std::string::npos)
      << message_of("cuda:0");
  EXPECT_NE(message_of("host:65").find("count 65 is outside"), std::string::npos)
      << message_of("host:65");
  EXPECT_NE(message_of("host:2x").find("'2x' is not a whole number"), std::string::npos)
      << message_of("host:2x");
  EXPECT_NE(message_of("tpu:2").find("expected host:N, cuda, cuda:N or auto"), std::string::npos)
      << message_of("tpu:2");
  auto be = make_backend("host:2");
  EXPECT_EQ(be->name(), "host:2");
  EXPECT_EQ(be->device_count(), 2);
  EXPECT_FALSE(be->is_gpu());
  EXPECT_THROW((void)be->allocate(2, 64), invalid_argument);
  EXPECT_THROW((void)be->allocate(0, 0), invalid_argument);
  auto buf = be->allocate(0, 64 * sizeof(double));
  const view v8 = view::dense(buf->data(), {8});
  const view v4x2 = view::dense(buf->data(), {4, 2});
  EXPECT_THROW(be->unary(0, queue_kind::compute, dtype::f64, unary_op::neg, v8, v4x2),
               invalid_argument);
  EXPECT_THROW(be->copy(1, queue_kind::transfer, dtype::f64, v8, 0, v8, 0), invalid_argument);
  EXPECT_THROW(be->reduce(0, queue_kind::compute, dtype::f64, reduce_op::sum, v8, v4x2, 2),
               invalid_argument);
  be->synchronize();
}

TEST(darray_backend, strided_views_reductions_and_gemm_match_the_host) {
  auto be = make_host_backend(2);
  // A 4x6 matrix on device 0; its columns 1,3,5 as a strided view.
  std::vector<double> h(24);
  for (std::size_t i = 0; i < h.size(); ++i) {
    h[i] = static_cast<double>(i) * 0.5 - 3.0;
  }
  auto src = be->allocate(0, h.size() * sizeof(double));
  const box whole{{slice{0, 4}, slice{0, 6}}};
  be->upload(0, dtype::f64, view::dense(src->data(), {4, 6}), view::dense(h.data(), {4, 6}));
  const view odd = view::of_box(src->data(), whole, box{{slice{0, 4}, slice{1, 6, 2}}});
  EXPECT_EQ(odd.stride[1], 2);
  EXPECT_FALSE(odd.contiguous());

  // Copy the strided view to device 1 (densely), negate it there.
  auto dst = be->allocate(1, 12 * sizeof(double));
  const view dense12 = view::dense(dst->data(), {4, 3});
  be->copy(1, queue_kind::transfer, dtype::f64, dense12, 1, odd, 0);
  const event copied = be->record(1, queue_kind::transfer);
  be->wait(1, queue_kind::compute, copied);
  be->unary(1, queue_kind::compute, dtype::f64, unary_op::neg, dense12, dense12);
  const auto got = download(*be, 1, dense12);
  for (std::size_t r = 0; r < 4; ++r) {
    for (std::size_t c = 0; c < 3; ++c) {
      EXPECT_EQ(got[r * 3 + c], -h[r * 6 + 2 * c + 1]);
    }
  }

  // Reduce the strided view along each axis and entirely, into accumulators holding 1.
  auto acc = be->allocate(0, 8 * sizeof(double));
  for (int axis = -1; axis < 2; ++axis) {
    const shape_t ext = axis < 0 ? shape_t{} : (axis == 0 ? shape_t{3} : shape_t{4});
    const view a = view::dense(acc->data(), ext);
    be->fill(0, queue_kind::compute, dtype::f64, a, scalar::of(1.0));
    be->reduce(0, queue_kind::compute, dtype::f64, reduce_op::sum, a, odd, axis);
    std::vector<double> want(static_cast<std::size_t>(a.size()), 1.0);
    for (std::size_t r = 0; r < 4; ++r) {
      for (std::size_t c = 0; c < 3; ++c) {
        const double v = h[r * 6 + 2 * c + 1];
        want[axis < 0 ? 0 : (axis == 0 ? c : r)] += v;
      }
    }
    EXPECT_EQ(download(*be, 0, a), want) << "axis " << axis;
  }

  // gemm on sub-blocks with leading dimensions: C(2x2) += A[0:2, 0:3] @ B[1:4, 4:6].
  auto c = be->allocate(0, 4 * sizeof(double));
  const view cv = view::dense(c->data(), {2, 2});
  be->fill(0, queue_kind::compute, dtype::f64, cv, scalar::of(10.0));
  const view av = view::of_box(src->data(), whole, box{{slice{0, 2}, slice{0, 3}}});
  const view bv = view::of_box(src->data(), whole, box{{slice{1, 4}, slice{4, 6}}});
  be->gemm_accumulate(0, queue_kind::compute, dtype::f64, cv, av, bv);
  const auto cg = download(*be, 0, cv);
  for (std::size_t i = 0; i < 2; ++i) {
    for (std::size_t j = 0; j < 2; ++j) {
      double want = 10.0;
      for (std::size_t p = 0; p < 3; ++p) {
        want += h[i * 6 + p] * h[(1 + p) * 6 + 4 + j];
      }
      EXPECT_DOUBLE_EQ(cg[i * 2 + j], want);
    }
  }
  be->synchronize();
}

// view::of_box against brute force: for random storage boxes (unit and larger steps) and random
// parts inside them, every element of the view lands where the storage's dense row-major layout
// keeps it; parts outside the storage are refused.
TEST(darray_backend, views_of_boxes_address_their_elements) {
  std::mt19937_64 rng(test_support::test_seed() + 5);
  const auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 2000; ++iter) {
    const auto rank = static_cast<std::size_t>(pick(1, 3));
    box storage;
    box part;
    for (std::size_t axis = 0; axis < rank; ++axis) {
      const std::int64_t step = pick(0, 2) == 0 ? pick(2, 3) : 1;
      const std::int64_t start = pick(-5, 5);
      const std::int64_t count = pick(1, 6);
      storage.dims.emplace_back(start, start + count * step, step);
      // A sub-range of the storage's indices, with a step that is a multiple of its step.
      const std::int64_t first = pick(0, count - 1);
      const std::int64_t last = pick(first, count - 1);
      const std::int64_t every = pick(0, 3) == 0 ? 2 : 1;
      part.dims.emplace_back(start + first * step, start + last * step + 1, step * every);
    }
    SCOPED_TRACE(storage.to_string() + " / " + part.to_string());
    const view v = view::of_box(nullptr, storage, part);
    ASSERT_EQ(v.rank, rank);
    // Walk the part's elements in row-major order; the view must visit the same dense positions.
    const auto extents = part.extents();
    std::vector<std::int64_t> idx(rank, 0);
    for (std::int64_t n = 0; n < part.size(); ++n) {
      std::int64_t at = v.offset;
      std::int64_t want = 0;
      for (std::size_t axis = 0; axis < rank; ++axis) {
        at += idx[axis] * v.stride[axis];
        const slice& w = storage.dims[axis];
        const std::int64_t global = part.dims[axis].start + idx[axis] * part.dims[axis].step;
        want = want * w.size() + (global - w.start) / w.step;
      }
      ASSERT_EQ(at, want) << "element " << n;
      for (std::size_t axis = rank; axis-- > 0;) {
        if (++idx[axis] < extents[axis]) {
          break;
        }
        idx[axis] = 0;
      }
    }
    for (std::size_t axis = 0; axis < rank; ++axis) {
      ASSERT_EQ(v.extent[axis], extents[axis]);
    }
  }
  const box storage{{slice(0, 10), slice(0, 4)}};
  EXPECT_THROW((void)view::of_box(nullptr, storage, box{{slice(0, 11), slice(0, 4)}}),
               invalid_argument);
  EXPECT_THROW((void)view::of_box(nullptr, storage, box{{slice(-1, 3), slice(0, 4)}}),
               invalid_argument);
  EXPECT_THROW((void)view::of_box(nullptr, storage, box{{slice(0, 3)}}), invalid_argument);
}

TEST(darray_backend, identities_and_names) {
  EXPECT_EQ(identity(reduce_op::sum, dtype::i32).i, 0);
  EXPECT_EQ(identity(reduce_op::prod, dtype::f64).f, 1.0);
  EXPECT_EQ(identity(reduce_op::max, dtype::i64).i, INT64_MIN);
  EXPECT_EQ(identity(reduce_op::min, dtype::i32).i, INT32_MAX);
  EXPECT_EQ(to_string(dtype::f32), "float32");
  EXPECT_EQ(size_of(dtype::i64), 8U);
}

// Each host device's pool is named for its device, so traces and reports tell them apart;
// with another resource the name is that resource's.
TEST(darray_backend, host_devices_pools_are_named_for_their_device) {
  backend_options options;
  options.allocator = "best_fit";
  auto be = make_backend("host:3", options);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(be->allocator(d).name(), "best_fit/host:" + std::to_string(d));
    EXPECT_EQ(be->allocator(d).device(), -1) << "host memory all the same";
  }
}

using test_support::gate;

// backend_stats_fields names every figure once: each entry reads its own member (set to a
// value of its own here), and the struct holds no figure the table lacks.
TEST(darray_backend, stats_fields_name_every_figure_once) {
  static_assert(sizeof(backend_stats) == backend_stats_fields.size() * sizeof(std::uint64_t),
                "a backend_stats figure without an entry in backend_stats_fields");
  backend_stats s;
  std::uint64_t v = 1;
  for (const auto& [name, field] : backend_stats_fields) {
    s.*field = v++;
  }
  std::set<std::string_view> names;
  std::set<std::uint64_t> values;
  for (const auto& [name, field] : backend_stats_fields) {
    names.insert(name);
    values.insert(s.*field);
  }
  EXPECT_EQ(names.size(), backend_stats_fields.size());
  EXPECT_EQ(values.size(), backend_stats_fields.size());  // no member read twice
  EXPECT_EQ(s.copies_local, 1U);                          // in declaration order
  EXPECT_EQ(s.bytes_ipc, backend_stats_fields.size());
}

TEST(darray_backend, waits_are_enqueued_only_when_they_order_something) {
  auto be = make_host_backend(2);
  auto g = std::make_shared<gate>();
  be->wait(0, queue_kind::compute, event(g));  // device 0's compute queue now blocks
  EXPECT_EQ(be->stats().waits, 1U);
  auto buf = be->allocate(0, 1024);
  const event e1 = be->record(0, queue_kind::compute);
  const event e2 = be->record(0, queue_kind::compute);
  ASSERT_FALSE(e1.ready());
  ASSERT_EQ(e1.state()->queue_key(), backend::queue_key(0, queue_kind::compute));
  EXPECT_EQ(e2.state()->sequence(), e1.state()->sequence() + 1);

  be->wait(0, queue_kind::compute, e2);  // same queue: in order already
  be->wait(0, queue_kind::transfer, e2);
  be->wait(0, queue_kind::transfer, e1);  // before e2 on the queue the transfer queue waits for
  be->wait(1, queue_kind::transfer, e1);  // another waiter
  auto s = be->stats();
  EXPECT_EQ(s.waits, 3U);
  EXPECT_EQ(s.waits_elided, 2U);

  // One event per queue is kept, and the buffer goes back only after the later one.
  buf->add_use(e1);
  buf->add_use(e2);
  const event t = be->record(0, queue_kind::transfer);  // after e2 (it waits for it)
  buf->add_use(t);
  buf.reset();
  auto more = be->allocate(0, 1024);  // nothing completed (and too little waits to collect)
  EXPECT_EQ(be->allocator(0).stats().in_use, 2048U);
  EXPECT_FALSE(t.ready());

  g->open();
  more.reset();
  be->synchronize();
  EXPECT_EQ(be->allocator(0).stats().in_use, 0U);
  EXPECT_TRUE(e2.ready() && t.ready());
  // Known complete after synchronize: nothing to enqueue.
  be->wait(1, queue_kind::compute, e2);
  EXPECT_EQ(be->stats().waits, 3U);
  EXPECT_EQ(be->stats().waits_elided, 3U);
}

TEST(darray_backend, small_allocations_return_deferred_buffers_in_batches) {
  auto be = make_host_backend(1);
  auto g = std::make_shared<gate>();
  be->wait(0, queue_kind::transfer, event(g));  // the transfer queue blocks until the gate opens
  // `count` buffers of 1 KiB whose last use is a pending transfer event: deferred when dropped.
  const auto defer = [&](int count) {  // (with the transfer queue blocked)
    event last;
    for (int i = 0; i < count; ++i) {
      auto buf = be->allocate(0, 1024);
      last = be->record(0, queue_kind::transfer);
      buf->add_use(last);
    }
    return last;
  };
  const event last = defer(10);
  g->open();
  last.wait();  // every use complete now, but nobody asked yet
  const auto in_use = [&] { return be->allocator(0).stats().in_use; };
  EXPECT_EQ(in_use(), 10U * 1024);
  auto small = be->allocate(0, 1024);  // 10 waiting, under 64: not collected
  EXPECT_EQ(in_use(), 11U * 1024);
  auto large = be->allocate(0, std::size_t{1} << 20);  // a large request collects first
  EXPECT_EQ(in_use(), 1024U + (std::size_t{1} << 20));
  large.reset();  // no uses: straight back

  // 64 waiting buffers make a small request collect too.
  auto g2 = std::make_shared<gate>();
  be->wait(0, queue_kind::transfer, event(g2));
  const event last64 = defer(64);
  g2->open();
  last64.wait();
  EXPECT_EQ(in_use(), 65U * 1024);
  auto next = be->allocate(0, 1024);
  EXPECT_EQ(in_use(), 2U * 1024);
  small.reset();
  next.reset();
  be->synchronize();
  EXPECT_EQ(in_use(), 0U);
}

// Compute on a device yields to a large copy out of it (backend_options::yield_to_copies: on
// GPUs its element-wise kernels get fewer blocks) exactly while that copy may still run: from
// the record after the copy until that event is seen complete. Not for a copy into the device,
// within it, below yield_min_bytes, nor with the option off; a pull on the receiver's queue
// counts for the sender.
TEST(darray_backend, compute_yields_to_a_large_copy_out_of_its_device_while_it_runs) {
  for (const bool on : {true, false}) {
    backend_options options;
    options.yield_to_copies = on;
    auto be = make_host_backend(3, options);
    constexpr std::size_t large = backend::yield_min_bytes;
    constexpr std::size_t n = large / sizeof(float);
    std::vector<std::shared_ptr<buffer>> bufs;
    std::vector<view> v;
    for (int d = 0; d < 3; ++d) {
      bufs.push_back(be->allocate(d, large));
      v.push_back(view::dense(bufs.back()->data(), {static_cast<std::int64_t>(n)}));
    }
    const auto yielding = [&] { return be->stats().compute_yielding; };
    const auto add_on = [&](int d) {  // a binary op on d's compute queue, in place
      be->binary(d, queue_kind::compute, dtype::f32, binary_op::add, v[d], v[d], v[d], nullptr,
                 nullptr);
    };
    auto g = std::make_shared<gate>();
    be->wait(0, queue_kind::transfer, event(g));  // device 0's and 1's transfer queues block
    be->wait(1, queue_kind::transfer, event(g));

    // A push out of device 0 of exactly yield_min_bytes, marked by the record after it.
    be->copy(0, queue_kind::transfer, dtype::f32, v[1], 1, v[0], 0);
    add_on(0);  // no record after the copy yet: nothing known to mark its end
    EXPECT_EQ(yielding(), 0U);
    const event pushed = be->record(0, queue_kind::transfer);
    add_on(0);
    add_on(0);
    add_on(1);  // the receiver does not yield (writes into a busy device are not slowed)
    add_on(2);
    EXPECT_EQ(yielding(), on ? 2U : 0U);
    // Smaller copies, and copies within a device, mark nothing.
    const view small = view::dense(bufs[2]->data(), {static_cast<std::int64_t>(n / 2)});
    be->copy(1, queue_kind::transfer, dtype::f32, view::dense(bufs[1]->data(), {n / 2}), 1, small,
             2);
    (void)be->record(1, queue_kind::transfer);
    be->copy(1, queue_kind::transfer, dtype::f32, v[1], 1, v[1], 1);
    (void)be->record(1, queue_kind::transfer);
    add_on(2);
    add_on(1);
    EXPECT_EQ(yielding(), on ? 2U : 0U);
    // A pull: device 2's data copied on device 1's (blocked) transfer queue.
    be->copy(1, queue_kind::transfer, dtype::f32, v[1], 1, v[2], 2);
    const event pulled = be->record(1, queue_kind::transfer);
    add_on(2);
    EXPECT_EQ(yielding(), on ? 3U : 0U);

    g->open();
    pushed.wait();
    pulled.wait();
    add_on(0);  // both copies seen complete now: full occupancy again
    add_on(2);
    EXPECT_EQ(yielding(), on ? 3U : 0U);
    be->synchronize();
  }
}

// A buffer dropped while its uses are pending, all on one queue, is handed to the next
// allocation of its size for work on that queue (which runs after those uses), and to no other:
// another size, queue or device, an allocation that names no queue, a buffer whose uses span two
// queues or lie on another device's queue. Pending buffers are never in the pool, so any pointer
// equal to theirs could only come from the reuse.
TEST(darray_backend, a_dropped_buffer_is_reused_in_stream_order_on_its_queue_only) {
  auto be = make_host_backend(2);
  auto g = std::make_shared<gate>();
  be->wait(0, queue_kind::compute, event(g));  // both compute queues block: every use pending
  be->wait(1, queue_kind::compute, event(g));
  const auto pending_on = [&](std::size_t bytes, std::vector<std::pair<int, queue_kind>> queues) {
    auto b = be->allocate(0, bytes);
    void* p = b->data();
    for (const auto& [d, q] : queues) {
      b->add_use(be->record(d, q));
    }
    return p;  // b dropped with its uses pending: deferred
  };
  void* const a = pending_on(4096, {{0, queue_kind::compute}, {0, queue_kind::compute}});
  const auto other_size = be->allocate(0, 2048, queue_kind::compute);
  const auto other_queue = be->allocate(0, 4096, queue_kind::transfer);
  const auto other_device = be->allocate(1, 4096, queue_kind::compute);
  const auto no_queue = be->allocate(0, 4096);
  for (const auto* b : {other_size.get(), other_queue.get(), other_device.get(), no_queue.get()}) {
    EXPECT_NE(b->data(), a);
  }
  EXPECT_EQ(be->stats().buffers_reused, 0U);
  const auto reused = be->allocate(0, 4096, queue_kind::compute);
  EXPECT_EQ(reused->data(), a);
  EXPECT_EQ(be->stats().buffers_reused, 1U);
  // It never went back to the pool: in use throughout, with the four others.
  EXPECT_EQ(be->allocator(0).stats().in_use, 2048U + 3U * 4096);

  void* const two_queues = pending_on(8192, {{0, queue_kind::compute}, {1, queue_kind::compute}});
  EXPECT_NE(be->allocate(0, 8192, queue_kind::compute)->data(), two_queues);
  void* const read_by_1 = pending_on(16384, {{1, queue_kind::compute}});  // a pull by device 1
  EXPECT_NE(be->allocate(1, 16384, queue_kind::compute)->data(), read_by_1);
  EXPECT_NE(be->allocate(0, 16384, queue_kind::compute)->data(), read_by_1);
  EXPECT_EQ(be->stats().buffers_reused, 1U);
  g->open();
  be->synchronize();
}

// `x = x + y` in a loop that runs far ahead of its devices (their compute queues held until the
// loop ends): each op's output takes the buffer the op before last dropped, so two buffers per
// device stay in use instead of one per op; the values prove the queue's order kept each write
// after the reads of what the buffer held before.
TEST(darray_backend, a_loop_far_ahead_of_its_devices_reuses_its_buffers) {
  auto be = make_host_backend(2);
  constexpr std::int64_t n = 1 << 14;
  constexpr std::size_t chunk_bytes = n / 2 * sizeof(float);
  const auto map = index_map::blocks({n}, 0, 2);
  auto x = distributed_array<float>::full(be, 1.0f, {n}, map);
  const auto y = distributed_array<float>::full(be, 2.0f, {n}, map);
  be->synchronize();
  auto g = std::make_shared<gate>();
  be->wait(0, queue_kind::compute, event(g));
  be->wait(1, queue_kind::compute, event(g));
  constexpr int ops = 100;
  for (int i = 0; i < ops; ++i) {
    x = x + y;
  }
  for (int d = 0; d < 2; ++d) {
    // x, y, and the buffer the last op freed for the next.
    EXPECT_LE(be->allocator(d).stats().peak_in_use, 3 * chunk_bytes) << "device " << d;
  }
  EXPECT_GE(be->stats().buffers_reused, 2U * (ops - 2));
  g->open();
  const std::vector<float> v = x.to_host();
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float e) { return e == 1.0f + 2.0f * ops; }));
}

// The same with a piece resharded into each op (`x = x + c.reshard(a's map)`). A small piece is
// pulled by the receiver on its compute queue, so the chunk it lands in takes a dropped buffer
// too. A large one (102 KiB here) is copied on the transfer queue, which is not held: its chunk
// must not take a buffer whose reads on the held compute queue are still to come (the values
// would show the overwrite).
TEST(darray_backend, a_loop_resharding_into_each_op_reuses_only_what_its_queues_order) {
  for (const std::int64_t n : {std::int64_t{1} << 12, std::int64_t{1} << 17}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    auto be = make_host_backend(2);
    const std::size_t chunk_bytes = static_cast<std::size_t>(n) / 2 * sizeof(float);
    const auto a_map = index_map::blocks({n}, 0, 2);
    const auto c_map = index_map::split({n}, 0, {{0, 0, n * 7 / 10}, {1, n * 7 / 10, n}});
    auto x = distributed_array<float>::full(be, 1.0f, {n}, a_map);
    const auto c = distributed_array<float>::full(be, 3.0f, {n}, c_map);
    be->synchronize();
    const std::size_t c_on_1 = be->allocator(1).stats().in_use - chunk_bytes;
    auto g = std::make_shared<gate>();
    be->wait(0, queue_kind::compute, event(g));
    be->wait(1, queue_kind::compute, event(g));
    constexpr int ops = 50;
    for (int i = 0; i < ops; ++i) {
      x = x + c.reshard(a_map);
    }
    if (n < (1 << 14)) {
      // Device 1: c's chunk, x, the chunk the piece lands in, the buffers the last op freed.
      EXPECT_LE(be->allocator(1).stats().peak_in_use, c_on_1 + 4 * chunk_bytes);
      EXPECT_GE(be->stats().buffers_reused, 3U * (ops - 2));  // outputs on both, landings on 1
    }
    g->open();
    const std::vector<float> v = x.to_host();
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float e) { return e == 1.0f + 3.0f * ops; }));
  }
}

// An event complete once opened, which counts the host's waits on it (a wait never blocks: the
// test waits only on opened events, or counts a wait it should not have made).
class counted_event final : public detail::event_state {
 public:
  [[nodiscard]] bool ready() const override { return open_.load(); }
  void wait() const override { waits_.fetch_add(1); }
  void open() { open_.store(true); }
  [[nodiscard]] int waits() const { return waits_.load(); }

 private:
  std::atomic<bool> open_{false};
  mutable std::atomic<int> waits_{0};
};

TEST(darray_backend, returned_deferred_buffers_are_not_waited_for_again) {
  auto be = make_host_backend(1);
  const auto in_use = [&] { return be->allocator(0).stats().in_use; };
  auto done = std::make_shared<counted_event>();
  auto pending = std::make_shared<counted_event>();
  {
    auto a = be->allocate(0, 1024);
    a->add_use(event(done));
    auto b = be->allocate(0, 1024);
    b->add_use(event(pending));
  }  // both deferred: their uses are not known complete
  EXPECT_EQ(in_use(), 2U * 1024);
  done->open();
  // A large request collects: a's use is asked and found complete, so a goes back without a wait
  // (each wait on a device event is a driver call, complete or not); b's is pending and stays.
  auto large = be->allocate(0, std::size_t{1} << 20);
  EXPECT_EQ(in_use(), 1024U + (std::size_t{1} << 20));
  EXPECT_EQ(done->waits(), 0);
  EXPECT_EQ(pending->waits(), 0);
  large.reset();
  // synchronize() collects everything: b's use, not known complete, is waited for once.
  pending->open();
  be->synchronize();
  EXPECT_EQ(pending->waits(), 1);
  EXPECT_EQ(done->waits(), 0);
  EXPECT_EQ(in_use(), 0U);
}

// An event of `owner`'s queue `key` with a sequence of the test's choosing: complete once the
// test's `done` reaches its sequence. Counts the queries (ready()) made of it into `queries`.
class sequenced_event final : public detail::event_state {
 public:
  sequenced_event(const backend* owner, int key, std::uint64_t sequence,
                  const std::atomic<std::uint64_t>& done, std::atomic<int>& queries)
      : event_state(owner, key, sequence), done_(done), queries_(queries) {}
  [[nodiscard]] bool ready() const override {
    queries_.fetch_add(1);
    return sequence() <= done_.load();
  }
  void wait() const override {}

 private:
  const std::atomic<std::uint64_t>& done_;
  std::atomic<int>& queries_;
};

// Deferred buffers whose uses are events of one queue: a collection finds the frontier between
// the complete and the pending ones by bisection — about log2 of them queries, not one per
// complete event (each a driver call on a GPU: docs/perf.md, "Kernels launched as graphs").
TEST(darray_backend, collecting_deferred_buffers_bisects_each_queue) {
  auto be = make_host_backend(1);
  const auto in_use = [&] { return be->allocator(0).stats().in_use; };
  // A real record first: the backend's queues exist, and sequences above 1 are the test's.
  be->record(0, queue_kind::compute).wait();
  const int key = backend::queue_key(0, queue_kind::compute);
  std::atomic<std::uint64_t> done{1};
  std::atomic<int> queries{0};
  constexpr std::uint64_t first = 2;
  constexpr std::size_t count = 100;
  constexpr std::size_t small = 1024;
  for (std::uint64_t s = first; s < first + count; ++s) {
    auto b = be->allocate(0, small);
    b->add_use(event(std::make_shared<sequenced_event>(be.get(), key, s, done, queries)));
  }
  // The small allocations collected twice on the way (with 64, then 96 buffers waiting), each
  // time finding the oldest event pending in one query.
  EXPECT_EQ(queries.load(), 2);
  ASSERT_EQ(in_use(), count * small);
  const std::size_t large = std::size_t{1} << 20;
  // Nothing complete: one query (the oldest), nothing returned.
  queries = 0;
  (void)be->allocate(0, large);
  EXPECT_EQ(queries.load(), 1);
  EXPECT_EQ(in_use(), count * small);
  // The first 60 complete: returned, with at most 2 + ceil(log2(100)) queries (was 61).
  done = first + 59;
  queries = 0;
  (void)be->allocate(0, large);
  EXPECT_EQ(in_use(), (count - 60) * small);
  EXPECT_LE(queries.load(), 2 + 7);
  EXPECT_GE(queries.load(), 2);
  // All complete: the oldest and the newest pending ones asked, everything returned.
  done = first + count;
  queries = 0;
  (void)be->allocate(0, large);
  EXPECT_EQ(in_use(), 0U);
  EXPECT_EQ(queries.load(), 2);
}

// A loop of small allocations far ahead of its devices: after a collection that returned
// nothing, the next waits until half as many buffers again are deferred (not every allocation).
TEST(darray_backend, small_allocations_collect_at_geometric_intervals) {
  auto be = make_host_backend(1);
  be->record(0, queue_kind::compute).wait();
  const int key = backend::queue_key(0, queue_kind::compute);
  std::atomic<std::uint64_t> done{1};
  std::atomic<int> queries{0};
  std::uint64_t seq = 2;
  const auto defer_one = [&] {
    auto b = be->allocate(0, 1024);
    b->add_use(event(std::make_shared<sequenced_event>(be.get(), key, seq++, done, queries)));
  };
  for (int i = 0; i < 64; ++i) {
    defer_one();  // the 64th allocation finds 63 waiting: no collection yet
  }
  EXPECT_EQ(queries.load(), 0);
  defer_one();  // 64 waiting: one collection, one query, nothing returned; the next at 96
  EXPECT_EQ(queries.load(), 1);
  for (int i = 0; i < 31; ++i) {
    defer_one();  // 65..95 waiting: below 64 + 32
  }
  EXPECT_EQ(queries.load(), 1);
  defer_one();  // 96 waiting: the next collection
  EXPECT_EQ(queries.load(), 2);
  // Once the devices caught up, a collection returns everything and the interval starts over.
  done = seq;
  be->synchronize();
  EXPECT_EQ(be->allocator(0).stats().in_use, 0U);
}

// A host task that throws (as a failing kernel would on a GPU) is never a silent wrong answer:
// events recorded after it on its queue throw from wait(), a queue that waits for such an event
// fails too, downloads from the device throw, and synchronize() reports it once; afterwards the
// backend computes correctly again.
TEST(darray_backend, a_failing_host_task_surfaces_at_the_next_wait) {
  auto be = make_host_backend(2);
  const auto message_of = [](const auto& f) {
    try {
      f();
    } catch (const runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const event before = be->record(0, queue_kind::compute);
  before.wait();
  detail::enqueue_failing_host_task(*be, 0, queue_kind::compute, "boom");
  const event after = be->record(0, queue_kind::compute);
  const std::string what = message_of([&] { after.wait(); });
  EXPECT_NE(what.find("boom"), std::string::npos) << what;
  EXPECT_NE(what.find("host device 0 (compute queue)"), std::string::npos) << what;
  EXPECT_NE(what.find("darray.failing"), std::string::npos) << what;
  EXPECT_NO_THROW(before.wait());  // recorded before the failure
  // Sticky on its queue until synchronize(): later events fail too.
  const event later = be->record(0, queue_kind::compute);
  EXPECT_NE(message_of([&] { later.wait(); }).find("boom"), std::string::npos);
  // Another device's queue is unaffected, until it waits for a failed event.
  const event clean = be->record(1, queue_kind::compute);
  EXPECT_NO_THROW(clean.wait());
  be->wait(1, queue_kind::transfer, after);
  const event propagated = be->record(1, queue_kind::transfer);
  const std::string carried = message_of([&] { propagated.wait(); });
  EXPECT_NE(carried.find("host device 1 (transfer queue)"), std::string::npos) << carried;
  EXPECT_NE(carried.find("boom"), std::string::npos) << carried;
  // Downloads from the failed device throw instead of returning what its queue computed.
  auto buf = be->allocate(0, 4 * sizeof(double));
  std::vector<double> out(4);
  EXPECT_THROW(
      be->download(0, dtype::f64, view::dense(out.data(), {4}), view::dense(buf->data(), {4})),
      runtime_error);
  // synchronize() reports the first failure once; then everything works again.
  EXPECT_NE(message_of([&] { be->synchronize(); }).find("boom"), std::string::npos);
  EXPECT_NO_THROW(be->synchronize());
  be->fill(0, queue_kind::compute, dtype::f64, view::dense(buf->data(), {4}), scalar(2.5));
  const event refilled = be->record(0, queue_kind::compute);
  EXPECT_NO_THROW(refilled.wait());
  be->download(0, dtype::f64, view::dense(out.data(), {4}), view::dense(buf->data(), {4}));
  EXPECT_EQ(out, std::vector<double>(4, 2.5));
  buf.reset();
  EXPECT_THROW(detail::enqueue_failing_host_task(*be, 2, queue_kind::compute, "x"),
               invalid_argument);
}

// The same through arrays: an array computed after the failure cannot be read back silently.
TEST(darray_backend, an_array_computed_after_a_failing_task_throws_on_to_host) {
  auto be = make_host_backend(2);
  const shape_t shape{64};
  const auto map = index_map::blocks(shape, 0, 2);
  const auto a = distributed_array<float>::full(be, 1.0f, shape, map);
  a.wait();
  detail::enqueue_failing_host_task(*be, 1, queue_kind::compute, "kernel fault");
  const auto b = a + a;
  EXPECT_THROW((void)b.to_host(), runtime_error);
  EXPECT_THROW(be->synchronize(), runtime_error);
  // Reported: new work is correct again.
  const auto c = a + a;
  EXPECT_EQ(c.to_host(), std::vector<float>(64, 2.0f));
}

}  // namespace
}  // namespace poolscope::darray
