// The host backend: N fake devices in host memory, each with a compute and a transfer worker
// thread. The executor above drives it exactly as it drives the CUDA backend, so CI tests the
// planner, the scheduling through events and every op without a GPU.
#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "poolscope/darray/backend.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/profiler/timeline.hpp"

#include "integer_pow.hpp"
#include "scope_sites.hpp"
#include "transfer_slices.hpp"

namespace poolscope::darray {
namespace {

using detail::accumulate_site;
using detail::reduce_site;
using detail::site_of;

// --- element arithmetic (the semantics backend.hpp states; kernels.cu mirrors them) ---

template <typename T>
T from_double(double v) noexcept {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v);
  } else {
    if (std::isnan(v)) {
      return T{0};
    }
    if (v >= static_cast<double>(std::numeric_limits<T>::max())) {
      return std::numeric_limits<T>::max();
    }
    if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) {
      return std::numeric_limits<T>::lowest();
    }
    return static_cast<T>(v);
  }
}

template <typename T>
T apply(unary_op op, T x) noexcept {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case unary_op::neg:
        return -x;
      case unary_op::abs:
        return std::abs(x);
      case unary_op::exp:
        return std::exp(x);
      case unary_op::log:
        return std::log(x);
      case unary_op::sin:
        return std::sin(x);
      case unary_op::cos:
        return std::cos(x);
      case unary_op::sqrt:
        return std::sqrt(x);
    }
  } else {
    using U = std::make_unsigned_t<T>;
    const double d = static_cast<double>(x);
    switch (op) {
      case unary_op::neg:
        return static_cast<T>(U{0} - static_cast<U>(x));
      case unary_op::abs:
        return x < 0 ? static_cast<T>(U{0} - static_cast<U>(x)) : x;
      case unary_op::exp:
        return from_double<T>(std::exp(d));
      case unary_op::log:
        return from_double<T>(std::log(d));
      case unary_op::sin:
        return from_double<T>(std::sin(d));
      case unary_op::cos:
        return from_double<T>(std::cos(d));
      case unary_op::sqrt:
        return from_double<T>(std::sqrt(d));
    }
  }
  return x;
}

template <typename T>
T apply(binary_op op, T a, T b) noexcept {
  switch (op) {
    case binary_op::add:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
      }
      return a + b;
    case binary_op::sub:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
      }
      return a - b;
    case binary_op::mul:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      }
      return a * b;
    case binary_op::div:
      if constexpr (std::is_integral_v<T>) {
        if (b == 0) {
          return T{0};
        }
        if (b == -1) {  // lowest / -1 overflows: wrap like neg
          using U = std::make_unsigned_t<T>;
          return static_cast<T>(U{0} - static_cast<U>(a));
        }
      }
      return a / b;
    case binary_op::maximum:
    case binary_op::minimum:
      if constexpr (std::is_floating_point_v<T>) {
        // A NaN operand is the result, the first when both are (as the kernels' max_of/min_of):
        // the backends agree to the bit.
        if (std::isnan(a)) {
          return a;
        }
        if (std::isnan(b)) {
          return b;
        }
      }
      if (op == binary_op::maximum) {
        return a < b ? b : a;
      }
      return b < a ? b : a;
    case binary_op::pow:
      if constexpr (std::is_floating_point_v<T>) {
        return std::pow(a, b);
      } else {
        return detail::integer_pow(a, b);
      }
  }
  return a;
}

template <typename T>
T combine(reduce_op op, T a, T b) noexcept {
  switch (op) {
    case reduce_op::sum:
      return apply(binary_op::add, a, b);
    case reduce_op::prod:
      return apply(binary_op::mul, a, b);
    case reduce_op::max:
      return apply(binary_op::maximum, a, b);
    case reduce_op::min:
      return apply(binary_op::minimum, a, b);
  }
  return a;
}

template <typename T>
T scalar_value(const scalar& s) noexcept {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(s.f);
  } else {
    return static_cast<T>(s.i);
  }
}

// Calls f(std::integral_constant<E, op>) for the runtime `op`, so that loops are compiled once
// per operation with the switch in apply() folded away.
template <typename E, E... Vs, typename F>
void with_op(E op, F&& f) {
  (void)((op == Vs ? (f(std::integral_constant<E, Vs>{}), true) : false) || ...);
}

template <typename F>
void with_unary(unary_op op, F&& f) {
  with_op<unary_op, unary_op::neg, unary_op::abs, unary_op::exp, unary_op::log, unary_op::sin,
          unary_op::cos, unary_op::sqrt>(op, std::forward<F>(f));
}
template <typename F>
void with_binary(binary_op op, F&& f) {
  with_op<binary_op, binary_op::add, binary_op::sub, binary_op::mul, binary_op::div,
          binary_op::maximum, binary_op::minimum, binary_op::pow>(op, std::forward<F>(f));
}
template <typename F>
void with_reduce(reduce_op op, F&& f) {
  with_op<reduce_op, reduce_op::sum, reduce_op::prod, reduce_op::max, reduce_op::min>(
      op, std::forward<F>(f));
}

// --- strided traversal ---

// Calls inner(offsets, count, strides) for every innermost row of the views (same extents as
// `shape`; offsets and strides in elements, one per view).
template <std::size_t K, typename F>
void walk(const view& shape, const std::array<const view*, K>& vs, F&& inner) {
  std::array<std::int64_t, K> off{};
  for (std::size_t k = 0; k < K; ++k) {
    off[k] = vs[k]->offset;
  }
  if (shape.size() == 0) {
    return;
  }
  if (shape.rank == 0) {
    inner(off, std::int64_t{1}, std::array<std::int64_t, K>{});
    return;
  }
  const std::size_t last = shape.rank - 1;
  std::array<std::int64_t, K> inner_stride{};
  for (std::size_t k = 0; k < K; ++k) {
    inner_stride[k] = vs[k]->stride[last];
  }
  std::array<std::int64_t, max_rank> idx{};
  for (;;) {
    inner(off, shape.extent[last], inner_stride);
    // Odometer over the outer axes.
    std::size_t d = last;
    for (;;) {
      if (d == 0) {
        return;
      }
      --d;
      ++idx[d];
      for (std::size_t k = 0; k < K; ++k) {
        off[k] += vs[k]->stride[d];
      }
      if (idx[d] < shape.extent[d]) {
        break;
      }
      for (std::size_t k = 0; k < K; ++k) {
        off[k] -= vs[k]->stride[d] * shape.extent[d];
      }
      idx[d] = 0;
    }
  }
}

template <typename T>
T* at(const view& v, std::int64_t offset) noexcept {
  return static_cast<T*>(v.base) + offset;
}

template <typename T>
void copy_typed(const view& dst, const view& src) {
  walk<2>(dst, {&dst, &src}, [&](auto off, std::int64_t n, auto st) {
    T* d = at<T>(dst, off[0]);
    const T* s = at<T>(src, off[1]);
    if (st[0] == 1 && st[1] == 1) {
      std::memcpy(d, s, static_cast<std::size_t>(n) * sizeof(T));
      return;
    }
    for (std::int64_t i = 0; i < n; ++i) {
      d[i * st[0]] = s[i * st[1]];
    }
  });
}

template <typename T>
void fill_typed(const view& dst, scalar value) {
  const T v = scalar_value<T>(value);
  walk<1>(dst, {&dst}, [&](auto off, std::int64_t n, auto st) {
    T* d = at<T>(dst, off[0]);
    for (std::int64_t i = 0; i < n; ++i) {
      d[i * st[0]] = v;
    }
  });
}

template <typename T>
void unary_typed(unary_op op, const view& dst, const view& src) {
  with_unary(op, [&](auto c) {
    walk<2>(dst, {&dst, &src}, [&](auto off, std::int64_t n, auto st) {
      T* d = at<T>(dst, off[0]);
      const T* s = at<T>(src, off[1]);
      if (st[0] == 1 && st[1] == 1) {
        for (std::int64_t i = 0; i < n; ++i) {
          d[i] = apply(c.value, s[i]);
        }
        return;
      }
      for (std::int64_t i = 0; i < n; ++i) {
        d[i * st[0]] = apply(c.value, s[i * st[1]]);
      }
    });
  });
}

// The dense case, vectorisable: the output may be one of the inputs (in place) but then it is
// the same element, which the loop reads before it writes.
template <typename T, typename C>
void contiguous_binary(C c, T* d, const T* x, const T* y, std::int64_t n) {
  if (d != x && d != y) {
    T* __restrict dr = d;
    const T* __restrict xr = x;
    const T* __restrict yr = y;
#pragma GCC ivdep
    for (std::int64_t i = 0; i < n; ++i) {
      dr[i] = apply(c.value, xr[i], yr[i]);
    }
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    d[i] = apply(c.value, x[i], y[i]);
  }
}

template <typename T>
void binary_typed(binary_op op, const view& dst, const view& a, const view& b, const scalar* as,
                  const scalar* bs) {
  // A scalar operand is a view with stride 0 over a local value.
  T a_value = as ? scalar_value<T>(*as) : T{};
  T b_value = bs ? scalar_value<T>(*bs) : T{};
  view av = a;
  view bv = b;
  if (as) {
    av = dst;
    av.base = &a_value;
    av.offset = 0;
    av.stride.fill(0);
  }
  if (bs) {
    bv = dst;
    bv.base = &b_value;
    bv.offset = 0;
    bv.stride.fill(0);
  }
  with_binary(op, [&](auto c) {
    walk<3>(dst, {&dst, &av, &bv}, [&](auto off, std::int64_t n, auto st) {
      T* d = at<T>(dst, off[0]);
      const T* x = at<T>(av, off[1]);
      const T* y = at<T>(bv, off[2]);
      if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
        contiguous_binary<T>(c, d, x, y, n);
        return;
      }
      for (std::int64_t i = 0; i < n; ++i) {
        d[i * st[0]] = apply(c.value, x[i * st[1]], y[i * st[2]]);
      }
    });
  });
}

template <typename T>
void accumulate_typed(reduce_op op, const view& acc, const view& src) {
  // `acc` may have zero strides (a reduction's broadcast accumulator): serial loops make that safe.
  with_reduce(op, [&](auto c) {
    walk<2>(src, {&acc, &src}, [&](auto off, std::int64_t n, auto st) {
      T* d = at<T>(acc, off[0]);
      const T* s = at<T>(src, off[1]);
      for (std::int64_t i = 0; i < n; ++i) {
        d[i * st[0]] = combine(c.value, d[i * st[0]], s[i * st[1]]);
      }
    });
  });
}

// The accumulator of a reduction seen with src's extents: stride 0 along the reduced axes.
view broadcast_accumulator(const view& acc, const view& src, int axis) {
  view b = src;
  b.base = acc.base;
  b.offset = acc.offset;
  if (axis < 0) {
    b.stride.fill(0);
    return b;
  }
  std::size_t j = 0;
  for (std::size_t i = 0; i < src.rank; ++i) {
    if (static_cast<int>(i) == axis) {
      b.stride[i] = 0;
    } else {
      b.stride[i] = acc.stride[j++];
    }
  }
  return b;
}

template <typename T>
void gemm_typed(const view& c, const view& a, const view& b) {
  const std::int64_t m = a.extent[0];
  const std::int64_t k = a.extent[1];
  const std::int64_t n = b.extent[1];
  for (std::int64_t i = 0; i < m; ++i) {
    T* crow = at<T>(c, c.offset + i * c.stride[0]);
    for (std::int64_t p = 0; p < k; ++p) {
      const T aval = *at<T>(a, a.offset + i * a.stride[0] + p * a.stride[1]);
      const T* brow = at<T>(b, b.offset + p * b.stride[0]);
      for (std::int64_t j = 0; j < n; ++j) {
        crow[j] = apply(binary_op::add, crow[j], apply(binary_op::mul, aval, brow[j]));
      }
    }
  }
}

template <template <typename> class Fn, typename... Args>
void dispatch(dtype t, Args&&... args) {
  switch (t) {
    case dtype::f32:
      Fn<float>{}(std::forward<Args>(args)...);
      return;
    case dtype::f64:
      Fn<double>{}(std::forward<Args>(args)...);
      return;
    case dtype::i32:
      Fn<std::int32_t>{}(std::forward<Args>(args)...);
      return;
    case dtype::i64:
      Fn<std::int64_t>{}(std::forward<Args>(args)...);
      return;
  }
}

template <typename T>
struct copy_fn {
  void operator()(const view& d, const view& s) const { copy_typed<T>(d, s); }
};
template <typename T>
struct fill_fn {
  void operator()(const view& d, scalar v) const { fill_typed<T>(d, v); }
};
template <typename T>
struct unary_fn {
  void operator()(unary_op op, const view& d, const view& s) const { unary_typed<T>(op, d, s); }
};
template <typename T>
struct binary_fn {
  void operator()(binary_op op, const view& d, const view& a, const view& b, const scalar* as,
                  const scalar* bs) const {
    binary_typed<T>(op, d, a, b, as, bs);
  }
};
template <typename T>
struct accumulate_fn {
  void operator()(reduce_op op, const view& acc, const view& s) const {
    accumulate_typed<T>(op, acc, s);
  }
};
template <typename T>
struct gemm_fn {
  void operator()(const view& c, const view& a, const view& b) const { gemm_typed<T>(c, a, b); }
};

// --- events and queues ---

// Complete once its queue reached it. Like a CUDA event after a failed kernel, an event recorded
// after a task of its queue failed (the queue's failure, until synchronize() reports it) is
// complete but failed: waiting for it throws runtime_error naming that task.
class host_event final : public detail::event_state {
 public:
  host_event(const void* owner, int queue_key, std::uint64_t sequence) noexcept
      : event_state(owner, queue_key, sequence) {}
  [[nodiscard]] bool ready() const override { return done_.load(std::memory_order_acquire); }
  [[nodiscard]] bool known_complete() const noexcept override { return ready(); }
  void wait() const override {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return done_.load(std::memory_order_acquire); });
    if (!failure_.empty()) {
      throw runtime_error(failure_);
    }
  }
  // `failure`: empty, or what failed on the queue before this event.
  void complete(std::string failure) noexcept {
    {
      const std::lock_guard lock(mutex_);
      failure_ = std::move(failure);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

 private:
  std::atomic<bool> done_{false};
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::string failure_;  // mutex_
};

// One in-order work queue run by its own thread (a stream of a fake device).
class work_queue {
 public:
  struct task {
    std::function<void()> run;
    // A name of process lifetime (a literal or a registered site's); empty: bookkeeping (events),
    // not traced. A copy's label (its ends and size) is made from `bytes` only when a trace or a
    // failure message needs it (see label()).
    std::string_view name;
    std::string_view category;
    int device = -1;      // the device the slice is attributed to (-1: the queue's)
    int src_device = -1;  // a copy between devices: its two ends (host_slice's)
    int dst_device = -1;
    bool copy = false;
    std::uint64_t bytes = 0;  // a copy's
  };

  work_queue(int device, queue_kind kind, std::function<profiler::timeline*()> timeline)
      : device_(device), kind_(kind), timeline_(std::move(timeline)), thread_([this] { loop(); }) {}
  work_queue(const work_queue&) = delete;
  work_queue& operator=(const work_queue&) = delete;
  ~work_queue() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void push(task t) {
    {
      const std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(t));
      ++pending_;
    }
    cv_.notify_all();
  }

  void drain() {
    std::unique_lock lock(mutex_);
    idle_cv_.wait(lock, [this] { return pending_ == 0; });
  }

  // The first task failure since the last take_failure() ("" if none): events recorded meanwhile
  // carry it. Taking it makes the queue clean again.
  // Every event record asks: without a failure (nearly always) that is one atomic load.
  [[nodiscard]] std::string failure() const {
    if (!failed_.load(std::memory_order_acquire)) {
      return {};
    }
    const std::lock_guard lock(mutex_);
    return failure_;
  }
  [[nodiscard]] std::string take_failure() {
    const std::lock_guard lock(mutex_);
    failed_.store(false, std::memory_order_release);
    return std::exchange(failure_, std::string());
  }

 private:
  // "dev0 compute", "dev1 transfer": the name a trace's thread track (Perfetto), top and gdb
  // show for this queue's thread. Linux takes at most 15 characters; snprintf cuts it there.
  void name_this_thread() const noexcept {
    char name[16];
    std::snprintf(name, sizeof name, "dev%d %s", device_,
                  kind_ == queue_kind::compute ? "compute" : "transfer");
    (void)pthread_setname_np(pthread_self(), name);  // a name is a courtesy: failure is harmless
  }

  void loop() {
    name_this_thread();
    for (;;) {
      task t;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) {
          return;  // stop_ and nothing left
        }
        t = std::move(tasks_.front());
        tasks_.pop_front();
      }
      run(t);
      {
        const std::lock_guard lock(mutex_);
        --pending_;
      }
      idle_cv_.notify_all();
    }
  }

  static detail::transfer_ends ends_of(const task& t) noexcept {
    return {t.name, t.src_device, t.dst_device, t.bytes};
  }
  // "darray.copy 0->1 0.25 MiB", "darray.copy local 0.25 MiB", or the task's name.
  static std::string label(const task& t) {
    return t.copy ? detail::transfer_label(ends_of(t)) : std::string(t.name);
  }

  void run(const task& t) noexcept {
    profiler::timeline* tl = t.name.empty() ? nullptr : timeline_();
    const std::uint64_t begin = tl ? hooks::now_ns() : 0;
    try {
      t.run();
    } catch (const std::exception& e) {
      fail(t, e.what());
    } catch (...) {
      fail(t, "unknown exception");
    }
    if (tl == nullptr) {
      return;
    }
    const int device = t.device >= 0 ? t.device : device_;
    if (t.copy) {
      detail::add_transfer_slice(*tl, ends_of(t), device, t.category, begin, hooks::now_ns());
    } else {
      tl->add_host_slice({.name = t.name,
                          .category = t.category,
                          .thread = 0,
                          .begin_ns = begin,
                          .end_ns = hooks::now_ns(),
                          .device = device});
    }
  }

  // Logs a task's failure and keeps the queue's first one (what later events carry).
  void fail(const task& t, const char* what) noexcept {
    try {
      std::string message = "darray host device " + std::to_string(device_) + " (" +
                            (kind_ == queue_kind::compute ? "compute" : "transfer") +
                            " queue): task " + (t.name.empty() ? std::string("wait") : label(t)) +
                            " failed: " + what;
      log(log_level::error, message);
      const std::lock_guard lock(mutex_);
      if (failure_.empty()) {
        failure_ = std::move(message);
        failed_.store(true, std::memory_order_release);
      }
    } catch (...) {
      // No memory for the message: the failure goes unrecorded (logged where possible).
    }
  }

  int device_;
  queue_kind kind_;
  std::function<profiler::timeline*()> timeline_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<task> tasks_;
  std::size_t pending_ = 0;
  bool stop_ = false;
  std::string failure_;              // mutex_
  std::atomic<bool> failed_{false};  // !failure_.empty() (written under mutex_)
  std::thread thread_;               // last: starts after the rest is built
};

// Host backend. Thread-safe as backend.hpp says: each queue's push is locked.
class host_backend final : public backend {
 public:
  host_backend(int devices, const backend_options& options) : options_(options), count_(devices) {
    // First: the queues and the traces name the devices by their number over every rank.
    join_group(options.group);
    const std::string res = options.resource.empty() ? "host" : options.resource;
    for (int d = 0; d < devices; ++d) {
      auto dev = std::make_unique<fake_device>();
      // Plain host memory named for its device ("host:0"), so that the allocators' names in
      // traces and reports ("bfc/host:0") say whose pool each is.
      if (res == "host") {
        dev->resource = std::make_unique<pool::host_resource>(
            std::numeric_limits<std::size_t>::max(), global_device(d));
      } else {
        dev->resource = pool::make_resource(res, d);
      }
      dev->allocator = pool::make_allocator(options.allocator, *dev->resource);
      auto tl = [this] { return attached_timeline(); };
      dev->compute = std::make_unique<work_queue>(global_device(d), queue_kind::compute, tl);
      dev->transfer = std::make_unique<work_queue>(global_device(d), queue_kind::transfer, tl);
      devices_.push_back(std::move(dev));
    }
    start_issuers(options, 0);  // an enqueue here is a queue push: nothing to overlap
    set_yield_to_copies(options.yield_to_copies);
  }

  ~host_backend() override {
    for (auto& d : devices_) {
      d->compute->drain();
      d->transfer->drain();
    }
    collect_deferred(true);
    for (auto& d : devices_) {
      d->compute.reset();
      d->transfer.reset();
    }
  }

  // detail::enqueue_failing_host_task.
  void enqueue_failing(int device, queue_kind q, const std::string& what) {
    if (!is_local(device)) {
      throw invalid_argument("darray enqueue_failing_host_task: device " + std::to_string(device) +
                             " is not one of this process's devices of " + name());
    }
    push(device - first_local_device(), q, "darray.failing", [what] { throw runtime_error(what); });
  }

 private:
  struct fake_device {
    std::unique_ptr<pool::resource> resource;
    std::unique_ptr<pool::allocator> allocator;
    std::unique_ptr<work_queue> compute;
    std::unique_ptr<work_queue> transfer;
  };

  work_queue& queue(int d, queue_kind q) {
    return q == queue_kind::compute ? *devices_[static_cast<std::size_t>(d)]->compute
                                    : *devices_[static_cast<std::size_t>(d)]->transfer;
  }
  // A traced task: its slice's category is the queue's ("darray.transfer" / "darray.compute")
  // unless `category` says otherwise.
  // `name`: of process lifetime (a literal or a site's name, see task).
  void push(int d, queue_kind q, std::string_view name, std::function<void()> fn,
            int slice_device = -1, std::string_view category = {}, int src_device = -1,
            int dst_device = -1, std::uint64_t copy_bytes = 0, bool copy = false) {
    if (category.empty()) {
      category = q == queue_kind::transfer ? std::string_view("darray.transfer") : "darray.compute";
    }
    queue(d, q).push(
        {std::move(fn), name, category, slice_device, src_device, dst_device, copy, copy_bytes});
  }
  // A site's name for a task ("darray.add"), or `fallback` when the site could not register it
  // (out of host memory: a name-less task would not be traced).
  static std::string_view name_of(const profiler::scope_site& site, std::string_view fallback) {
    const std::string_view n = site.name();
    return n.empty() ? fallback : n;
  }

  std::string do_name() const override { return "host:" + std::to_string(count_); }
  int do_device_count() const noexcept override { return count_; }
  bool do_is_gpu() const noexcept override { return false; }
  std::string do_device_name(int device) const override {
    return "host device " + std::to_string(global_device(device));
  }
  pool::allocator& do_allocator(int device) override {
    return *devices_[static_cast<std::size_t>(device)]->allocator;
  }
  stream_view do_alloc_stream(int device) const noexcept override {
    // A stable per-device key (stream pools keep a pool per key).
    return stream_view(devices_[static_cast<std::size_t>(device)]->compute.get());
  }

  event do_record(int device, queue_kind q, std::uint64_t sequence) override {
    auto e = std::make_shared<host_event>(this, queue_key(device, q), sequence);
    work_queue& wq = queue(device, q);
    wq.push({[e, &wq] {
               std::string failure;
               try {
                 failure = wq.failure();
               } catch (...) {
                 failure = "a task failed";  // short: no allocation; the event must complete
               }
               e->complete(std::move(failure));
             },
             {},
             {}});
    return event(e);
  }
  // A failed event's failure becomes the waiting queue's (the waiting task throws it).
  void do_wait(int device, queue_kind q, const event& e) override {
    queue(device, q).push({[e] { e.wait(); }, {}, {}});
  }
  void do_synchronize() override {
    for (auto& d : devices_) {
      d->compute->drain();
      d->transfer->drain();
    }
    // Every queue is idle: report the first failure since the last synchronize, once.
    std::string first;
    for (auto& d : devices_) {
      for (work_queue* wq : {d->compute.get(), d->transfer.get()}) {
        std::string f = wq->take_failure();
        if (first.empty()) {
          first = std::move(f);
        }
      }
    }
    if (!first.empty()) {
      throw runtime_error(first);
    }
  }
  // Throws the failure of one of `device`'s queues, if any (after draining them).
  void check_failed(int device) {
    for (const queue_kind q : {queue_kind::compute, queue_kind::transfer}) {
      const std::string f = queue(device, q).failure();
      if (!f.empty()) {
        throw runtime_error(f);
      }
    }
  }

  void do_copy(int queue_device, queue_kind q, dtype t, const view& dst, int dst_device,
               const view& src, int src_device, transport) override {
    const std::uint64_t bytes = static_cast<std::uint64_t>(dst.size()) * size_of(t);
    const bool peer = dst_device != src_device;
    count_copy(peer, bytes, false);
    // A copy between devices is traced on the receiving device, whichever queue ran it: that is
    // where it overlaps (or not) with the compute waiting for it; its two ends make it transfer
    // time on the sender too, as CUPTI's peer copies are. A copy is a transfer on either queue
    // (small pieces run on the receiver's compute queue), as the CUDA backend's ranges say. Its
    // label ("darray.copy 0->1 0.25 MiB") is made only when traced (or failing).
    const int to = peer ? global_device(dst_device) : -1;
    const int from = peer ? global_device(src_device) : -1;
    push(
        queue_device, q, "darray.copy", [t, dst, src] { dispatch<copy_fn>(t, dst, src); }, to,
        "darray.transfer", from, to, bytes, true);
  }

  // A transfer with another rank: MPI on the device's transfer worker, which polls it until done
  // (process_group bounds the wait by its timeout; a failure fails the task like any other).
  // Traced like a copy between devices, with both ends ("darray.send 0->3 0.25 MiB").
  void do_send(int device, dtype t, const view& src, int peer_device, int peer_rank,
               int tag) override {
    const std::uint64_t bytes = static_cast<std::uint64_t>(src.size()) * size_of(t);
    const void* data = static_cast<const std::byte*>(src.base) + src.offset * size_of(t);
    push(
        device, queue_kind::transfer, "darray.send",
        [g = group(), data, bytes, peer_rank, tag] { g->send(data, bytes, peer_rank, tag); },
        global_device(device), "darray.transfer", global_device(device), peer_device, bytes, true);
  }
  void do_receive(int device, dtype t, const view& dst, int peer_device, int peer_rank,
                  int tag) override {
    const std::uint64_t bytes = static_cast<std::uint64_t>(dst.size()) * size_of(t);
    void* data = static_cast<std::byte*>(dst.base) + dst.offset * size_of(t);
    push(
        device, queue_kind::transfer, "darray.receive",
        [g = group(), data, bytes, peer_rank, tag] { g->receive(data, bytes, peer_rank, tag); },
        global_device(device), "darray.transfer", peer_device, global_device(device), bytes, true);
  }

  void do_upload(int device, dtype t, const view& dst, const view& host_src) override {
    // Into freshly allocated memory in practice; ordered after the device's queued work anyway.
    queue(device, queue_kind::compute).drain();
    queue(device, queue_kind::transfer).drain();
    dispatch<copy_fn>(t, dst, host_src);
  }
  void do_download(int device, dtype t, const view& host_dst, const view& src) override {
    queue(device, queue_kind::compute).drain();
    queue(device, queue_kind::transfer).drain();
    check_failed(device);  // what the queues computed may be wrong
    dispatch<copy_fn>(t, host_dst, src);
  }

  // (`yielding`: fewer blocks on GPUs; nothing to yield here: a host device has no copy engine)
  void do_fill(int device, queue_kind q, dtype t, const view& dst, scalar value,
               bool /*yielding*/) override {
    count_op();
    push(device, q, "darray.fill", [t, dst, value] { dispatch<fill_fn>(t, dst, value); });
  }
  void do_unary(int device, queue_kind q, dtype t, unary_op op, const view& dst, const view& src,
                bool /*yielding*/) override {
    count_op();
    push(device, q, name_of(site_of(op), "darray.unary"),
         [t, op, dst, src] { dispatch<unary_fn>(t, op, dst, src); });
  }
  void do_binary(int device, queue_kind q, dtype t, binary_op op, const view& dst, const view& a,
                 const view& b, const scalar* a_scalar, const scalar* b_scalar,
                 bool /*yielding*/) override {
    count_op();
    const bool has_a = a_scalar != nullptr;
    const bool has_b = b_scalar != nullptr;
    const scalar as = has_a ? *a_scalar : scalar{};
    const scalar bs = has_b ? *b_scalar : scalar{};
    push(device, q, name_of(site_of(op), "darray.binary"),
         [t, op, dst, a, b, has_a, has_b, as, bs] {
           dispatch<binary_fn>(t, op, dst, a, b, has_a ? &as : nullptr, has_b ? &bs : nullptr);
         });
  }
  void do_binary_parts(int device, queue_kind q, dtype t, binary_op op,
                       const std::vector<binary_part>& parts, bool /*yielding*/) override {
    count_op();  // one task, as the CUDA backend's one launch
    push(device, q, name_of(site_of(op), "darray.binary"), [t, op, parts] {
      for (const binary_part& p : parts) {
        dispatch<binary_fn>(t, op, p.dst, p.a, p.b, nullptr, nullptr);
      }
    });
  }
  void do_accumulate(int device, queue_kind q, dtype t, reduce_op op, const view& acc,
                     const view& src) override {
    count_op();
    push(device, q, name_of(accumulate_site(op), "darray.accumulate"),
         [t, op, acc, src] { dispatch<accumulate_fn>(t, op, acc, src); });
  }
  void do_reduce(int device, queue_kind q, dtype t, reduce_op op, const view& acc, const view& src,
                 int axis) override {
    count_op();
    const view b = broadcast_accumulator(acc, src, axis);
    push(device, q, name_of(reduce_site(op), "darray.reduce"),
         [t, op, b, src] { dispatch<accumulate_fn>(t, op, b, src); });
  }
  void do_gemm_accumulate(int device, queue_kind q, dtype t, const view& c, const view& a,
                          const view& b) override {
    count_op();
    push(device, q, "darray.gemm", [t, c, a, b] { dispatch<gemm_fn>(t, c, a, b); });
  }

  backend_options options_;
  int count_;
  std::vector<std::unique_ptr<fake_device>> devices_;
};

}  // namespace

void detail::enqueue_failing_host_task(backend& be, int device, queue_kind q,
                                       const std::string& what) {
  auto* host = dynamic_cast<host_backend*>(&be);
  if (host == nullptr) {
    throw invalid_argument("darray enqueue_failing_host_task: " + be.name() +
                           " is not a host backend");
  }
  host->enqueue_failing(device, q, what);
}

std::shared_ptr<backend> make_host_backend(int devices, const backend_options& options) {
  if (devices < 1 || devices > 64) {
    throw invalid_argument("darray host backend: " + std::to_string(devices) +
                           " devices (expected 1..64)");
  }
  return std::make_shared<host_backend>(devices, options);
}

}  // namespace poolscope::darray
