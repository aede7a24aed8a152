// mpi_staging (mpi_staging.hpp): device data between ranks through host staging and MPI.
#include "mpi_staging.hpp"

#include <exception>
#include <utility>

#include "poolscope/error.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/factory.hpp"

namespace poolscope::darray::detail {

// Host memory from the pool, returned by whoever holds it last (a worker's job, or the caller
// when a receive fails).
struct mpi_staging::staging {
  staging(pool::allocator& pool, std::size_t bytes)
      : pool_(pool), bytes_(bytes), data_(pool.allocate(stream_view{}, bytes)) {}
  staging(const staging&) = delete;
  staging& operator=(const staging&) = delete;
  ~staging() { pool_.deallocate(stream_view{}, data_, bytes_); }
  [[nodiscard]] void* data() const noexcept { return data_; }

 private:
  pool::allocator& pool_;
  std::size_t bytes_;
  void* data_;
};

mpi_staging::mpi_staging(std::shared_ptr<process_group> group, int devices, device_copies& copies,
                         std::unique_ptr<pool::resource> host_memory)
    : group_(std::move(group)),
      copies_(copies),
      host_memory_(std::move(host_memory)),
      pool_(pool::make_allocator("bfc", *host_memory_)) {
  for (int d = 0; d < devices; ++d) {
    workers_.push_back(std::make_unique<ordered_worker>(
        "darray " + group_->describe() + ", sends by MPI from device " + std::to_string(d)));
  }
}

mpi_staging::~mpi_staging() {
  for (auto& w : workers_) {
    w->drain();
    if (auto f = w->take_failure()) {
      poolscope::log(log_level::error, *f);
    }
  }
}

std::shared_ptr<mpi_staging::staging> mpi_staging::take(std::size_t bytes) {
  return std::make_shared<staging>(*pool_, bytes);
}

ordered_worker& mpi_staging::worker(int device) {
  if (device < 0 || static_cast<std::size_t>(device) >= workers_.size()) {
    throw invalid_argument("darray mpi staging: device " + std::to_string(device) +
                           " is not one of the " + std::to_string(workers_.size()) +
                           " devices of this process");
  }
  return *workers_[static_cast<std::size_t>(device)];
}

void mpi_staging::send(int device, const void* src, std::size_t bytes, int peer, int tag,
                       const std::string& what) {
  ordered_worker& w = worker(device);
  auto host = take(bytes);
  std::function<void()> copied = copies_.enqueue_copy(device, host->data(), src, bytes, true);
  w.push([g = group_, host = std::move(host), copied = std::move(copied), bytes, peer, tag, what] {
    copied();
    try {
      g->send(host->data(), bytes, peer, tag);
    } catch (const std::exception& e) {
      throw communication_error(what + ": " + e.what());  // check() reports it
    }
  });
}

void mpi_staging::receive(int device, void* dst, std::size_t bytes, int peer, int tag,
                          const std::string& what) {
  ordered_worker& w = worker(device);
  auto host = take(bytes);
  try {
    group_->receive(host->data(), bytes, peer, tag);
  } catch (const communication_error& e) {
    throw communication_error(what + ": " + e.what());
  }
  std::function<void()> copied = copies_.enqueue_copy(device, dst, host->data(), bytes, false);
  // The staging goes back to the pool once the copy has read it: the worker waits for that (in
  // its order, behind the sends handed to it before, which wait only for device work and peers).
  w.push([host = std::move(host), copied = std::move(copied)]() mutable {
    copied();
    host.reset();
  });
}

void mpi_staging::drain() {
  for (auto& w : workers_) {
    w->drain();
  }
}

void mpi_staging::check() {
  for (auto& w : workers_) {
    if (auto f = w->take_failure()) {
      throw communication_error(f->empty() ? std::string("darray: a send by MPI failed") : *f);
    }
  }
}

pool::allocator_stats mpi_staging::staging_stats() const {
  return pool_->stats();
}

}  // namespace poolscope::darray::detail
