// mpi_staging (mpi_staging.hpp): device data between ranks through host staging and MPI.
#include "mpi_staging.hpp"

#include <atomic>
#include <exception>
#include <utility>

#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/factory.hpp"

namespace poolscope::darray::detail {

namespace {
// Where a staging's gate sits: after its bytes, 8-byte aligned (the pool's blocks are aligned
// more than that).
constexpr std::size_t gate_offset(std::size_t bytes) noexcept {
  return (bytes + 7) & ~std::size_t{7};
}

void open_gate(std::uint32_t* gate) noexcept {
  std::atomic_ref<std::uint32_t> g(*gate);
  g.store(1, std::memory_order_release);
  g.notify_all();
}

// Opens a gate however the scope ends: a queue waiting at it never waits for ever.
class gate_opener {
 public:
  explicit gate_opener(std::uint32_t* gate) noexcept : gate_(gate) {}
  gate_opener(const gate_opener&) = delete;
  gate_opener& operator=(const gate_opener&) = delete;
  ~gate_opener() { open_gate(gate_); }

 private:
  std::uint32_t* gate_;
};
}  // namespace

// Host memory from the pool (the bytes, then a closed gate), returned by whoever holds it last
// (a worker's job, or the caller when enqueueing fails).
struct mpi_staging::staging {
  staging(pool::allocator& pool, std::size_t bytes)
      : pool_(pool),
        size_(gate_offset(bytes) + sizeof(std::uint32_t)),
        data_(pool.allocate(stream_view{}, size_)) {
    *gate() = 0;
  }
  staging(const staging&) = delete;
  staging& operator=(const staging&) = delete;
  ~staging() { pool_.deallocate(stream_view{}, data_, size_); }
  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::uint32_t* gate() const noexcept {
    return reinterpret_cast<std::uint32_t*>(static_cast<std::byte*>(data_) +
                                            (size_ - sizeof(std::uint32_t)));
  }

 private:
  pool::allocator& pool_;
  std::size_t size_;
  void* data_;
};

mpi_staging::mpi_staging(std::shared_ptr<process_group> group, int devices, device_copies& copies,
                         std::unique_ptr<pool::resource> host_memory,
                         std::function<profiler::timeline*()> timeline)
    : group_(std::move(group)),
      copies_(copies),
      host_memory_(std::move(host_memory)),
      pool_(pool::make_allocator("bfc", *host_memory_)),
      timeline_(std::move(timeline)) {
  for (int d = 0; d < devices; ++d) {
    const std::string of = "darray " + group_->describe() + ", ";
    senders_.push_back(
        std::make_unique<ordered_worker>(of + "sends by MPI from device " + std::to_string(d)));
    receivers_.push_back(
        std::make_unique<ordered_worker>(of + "receives by MPI to device " + std::to_string(d)));
  }
}

mpi_staging::~mpi_staging() {
  // The receivers first: the senders may wait for copies behind their gates.
  for (auto* workers : {&receivers_, &senders_}) {
    for (auto& w : *workers) {
      w->drain();
      if (auto f = w->take_failure()) {
        poolscope::log(log_level::error, *f);
      }
    }
  }
}

std::shared_ptr<mpi_staging::staging> mpi_staging::take(std::size_t bytes) {
  return std::make_shared<staging>(*pool_, bytes);
}

std::size_t mpi_staging::checked(int device) const {
  if (device < 0 || static_cast<std::size_t>(device) >= senders_.size()) {
    throw invalid_argument("darray mpi staging: device " + std::to_string(device) +
                           " is not one of the " + std::to_string(senders_.size()) +
                           " devices of this process");
  }
  return static_cast<std::size_t>(device);
}

template <typename Move>
void mpi_staging::transfer(const transfer_ends& traced, const std::string& what,
                           Move&& move) const {
  const std::uint64_t begin = hooks::now_ns();
  try {
    move();
  } catch (const std::exception& x) {
    throw communication_error(what + ": " + x.what());
  }
  if (profiler::timeline* tl = timeline_ ? timeline_() : nullptr; tl != nullptr) {
    add_transfer_slice(*tl, traced, this_end(traced), rank_piece_category, begin, hooks::now_ns());
  }
}

void mpi_staging::send(int device, const void* src, std::size_t bytes, int peer, int tag,
                       const transfer_ends& traced, const std::string& what) {
  ordered_worker& w = *senders_[checked(device)];
  auto host = take(bytes);
  std::function<void()> copied = copies_.enqueue_download(device, host->data(), src, bytes);
  w.push([this, g = group_, host = std::move(host), copied = std::move(copied), bytes, peer, tag,
          traced, what] {
    copied();
    transfer(traced, what, [&] { g->send(host->data(), bytes, peer, tag); });
  });
}

void mpi_staging::receive(int device, void* dst, std::size_t bytes, int peer, int tag,
                          const transfer_ends& traced, const std::string& what) {
  const std::size_t d = checked(device);
  auto host = take(bytes);
  std::function<void()> copied;
  try {
    copied = copies_.enqueue_gated_upload(device, dst, host->data(), bytes, host->gate());
  } catch (...) {
    open_gate(host->gate());  // the wait may be enqueued without its copy: let the queue go on
    throw;
  }
  try {
    receivers_[d]->push([this, g = group_, host, bytes, peer, tag, traced, what] {
      const gate_opener open(host->gate());  // after the bytes, or after the failure
      transfer(traced, what, [&] { g->receive(host->data(), bytes, peer, tag); });
    });
  } catch (...) {
    open_gate(host->gate());  // no receive will open it: the copy moves stale bytes instead
    throw;
  }
  // The staging goes back to the pool once the copy has read it: the send worker waits for that
  // (in its order, behind the sends handed to it before, which wait only for device work and
  // peers).
  senders_[d]->push([host = std::move(host), copied = std::move(copied)]() mutable {
    copied();
    host.reset();
  });
}

void mpi_staging::drain() {
  for (auto* workers : {&receivers_, &senders_}) {
    for (auto& w : *workers) {
      w->drain();
    }
  }
}

void mpi_staging::check() {
  for (auto* workers : {&receivers_, &senders_}) {
    for (auto& w : *workers) {
      if (auto f = w->take_failure()) {
        throw communication_error(f->empty() ? std::string("darray: a transfer by MPI failed")
                                             : *f);
      }
    }
  }
}

pool::allocator_stats mpi_staging::staging_stats() const {
  return pool_->stats();
}

}  // namespace poolscope::darray::detail
