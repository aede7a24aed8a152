// mpi_staging (mpi_staging.hpp): device data between ranks through host staging and MPI.
#include "mpi_staging.hpp"

#include <algorithm>
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

// Host memory from the pool (the bytes, then a closed gate per chunk received), returned by
// whoever holds it last (a worker's job, or the caller when enqueueing fails).
struct mpi_staging::staging {
  staging(pool::allocator& pool, std::size_t bytes, std::size_t gates)
      : pool_(pool),
        size_(gate_offset(bytes) + std::max<std::size_t>(gates, 1) * sizeof(std::uint32_t)),
        data_(pool.allocate(stream_view{}, size_)),
        gates_(
            reinterpret_cast<std::uint32_t*>(static_cast<std::byte*>(data_) + gate_offset(bytes))) {
    std::fill_n(gates_, gates, 0U);
  }
  staging(const staging&) = delete;
  staging& operator=(const staging&) = delete;
  ~staging() { pool_.deallocate(stream_view{}, data_, size_); }
  [[nodiscard]] std::byte* at(std::size_t offset) const noexcept {
    return static_cast<std::byte*>(data_) + offset;
  }
  [[nodiscard]] std::uint32_t* gate(std::size_t chunk) const noexcept { return gates_ + chunk; }

 private:
  pool::allocator& pool_;
  std::size_t size_;
  void* data_;
  std::uint32_t* gates_;
};

// One piece's transfer: what names it, its trace, and when its first chunk began to move (its
// chunks run one after another on one worker, which alone touches `begin`).
struct mpi_staging::piece {
  transfer_ends traced;
  std::string what;
  std::size_t chunks = 1;
  std::uint64_t begin = 0;
};

mpi_staging::mpi_staging(std::shared_ptr<process_group> group, int devices, device_copies& copies,
                         std::unique_ptr<pool::resource> host_memory,
                         std::function<profiler::timeline*()> timeline, std::size_t chunk_bytes)
    : group_(std::move(group)),
      copies_(copies),
      host_memory_(std::move(host_memory)),
      pool_(pool::make_allocator("bfc", *host_memory_)),
      timeline_(std::move(timeline)),
      chunk_bytes_(chunk_bytes) {
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

std::size_t mpi_staging::chunks(std::size_t bytes) const noexcept {
  return chunk_bytes_ == 0 || bytes <= chunk_bytes_ ? 1 : (bytes - 1) / chunk_bytes_ + 1;
}

std::shared_ptr<mpi_staging::staging> mpi_staging::take(std::size_t bytes, std::size_t gates) {
  return std::make_shared<staging>(*pool_, bytes, gates);
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
void mpi_staging::transfer(piece& p, std::size_t chunk, Move&& move) const {
  const std::uint64_t begin = hooks::now_ns();
  if (chunk == 0) {
    p.begin = begin;
  }
  try {
    move();
  } catch (const std::exception& x) {
    std::string what = p.what;
    if (p.chunks > 1) {
      what += " (chunk " + std::to_string(chunk + 1) + " of " + std::to_string(p.chunks) + ")";
    }
    throw communication_error(what + ": " + x.what());
  }
  if (chunk + 1 != p.chunks) {
    return;
  }
  if (profiler::timeline* tl = timeline_ ? timeline_() : nullptr; tl != nullptr) {
    add_transfer_slice(*tl, p.traced, this_end(p.traced), rank_piece_category, p.begin,
                       hooks::now_ns());
  }
}

void mpi_staging::send(int device, const void* src, std::size_t bytes, int peer, int tag,
                       const transfer_ends& traced, const std::string& what) {
  ordered_worker& w = *senders_[checked(device)];
  auto p = std::make_shared<piece>(piece{traced, what, chunks(bytes)});
  auto host = take(bytes, 0);
  const auto* from = static_cast<const std::byte*>(src);
  for (std::size_t k = 0; k < p->chunks; ++k) {
    const std::size_t at = k * chunk_bytes_;
    const std::size_t n = p->chunks == 1 ? bytes : std::min(chunk_bytes_, bytes - at);
    std::function<void()> copied = copies_.enqueue_download(device, host->at(at), from + at, n);
    w.push([this, g = group_, host, p, copied = std::move(copied), k, at, n, peer, tag] {
      copied();
      transfer(*p, k, [&] { g->send(host->at(at), n, peer, tag); });
    });
  }
}

void mpi_staging::receive(int device, void* dst, std::size_t bytes, int peer, int tag,
                          const transfer_ends& traced, const std::string& what) {
  const std::size_t d = checked(device);
  auto p = std::make_shared<piece>(piece{traced, what, chunks(bytes)});
  auto host = take(bytes, p->chunks);
  auto* to = static_cast<std::byte*>(dst);
  const auto extent = [&](std::size_t k) {
    return p->chunks == 1 ? bytes : std::min(chunk_bytes_, bytes - k * chunk_bytes_);
  };
  // Every gate from `k` on is opened here: no receive will open them, so the copies behind them
  // move stale bytes instead of holding the queue.
  const auto open_from = [&](std::size_t k) {
    for (; k < p->chunks; ++k) {
      open_gate(host->gate(k));
    }
  };
  std::vector<std::function<void()>> copied;
  copied.reserve(p->chunks);
  try {
    for (std::size_t k = 0; k < p->chunks; ++k) {
      const std::size_t at = k * chunk_bytes_;
      copied.push_back(
          copies_.enqueue_gated_upload(device, to + at, host->at(at), extent(k), host->gate(k)));
    }
  } catch (...) {
    open_from(0);  // a wait may be enqueued without its copy: let the queue go on
    release_after(d, std::move(host), std::move(copied));
    throw;
  }
  std::size_t pushed = 0;
  try {
    for (; pushed < p->chunks; ++pushed) {
      const std::size_t at = pushed * chunk_bytes_;
      receivers_[d]->push(
          [this, g = group_, host, p, k = pushed, at, n = extent(pushed), peer, tag] {
            const gate_opener open(host->gate(k));  // after the bytes, or after the failure
            transfer(*p, k, [&] { g->receive(host->at(at), n, peer, tag); });
          });
    }
  } catch (...) {
    open_from(pushed);
    release_after(d, std::move(host), std::move(copied));
    throw;
  }
  release_after(d, std::move(host), std::move(copied));
}

void mpi_staging::release_after(std::size_t device, std::shared_ptr<staging> host,
                                std::vector<std::function<void()>> copied) {
  // On the send worker, in its order behind the sends handed to it before (which wait only for
  // device work and peers).
  try {
    senders_[device]->push([host, copied = std::move(copied)]() mutable {
      for (auto& c : copied) {
        c();
      }
      host.reset();
    });
  } catch (...) {
    // The copies may still read the staging, and waiting for them here could wait for peers
    // that wait for this thread: the staging stays out of the pool for good.
    poolscope::log(log_level::error,
                   "darray mpi staging: a receive's staging is kept: its release could not be "
                   "handed to the send worker");
    static_cast<void>(new std::shared_ptr<staging>(std::move(host)));
    throw;
  }
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
