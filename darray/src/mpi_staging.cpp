// mpi_staging (mpi_staging.hpp): GPU data between ranks through pinned host memory and MPI.
#include "mpi_staging.hpp"

#include <utility>

#include "poolscope/error.hpp"
#include "poolscope/pool/factory.hpp"

namespace poolscope::darray::detail {

using seam::device_guard;
using seam::log_failure;

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

namespace {
// Blocks until `e` completes, then destroys it (also when the wait fails).
void finish(cudaEvent_t e) {
  const cudaError_t waited = cudaEventSynchronize(e);
  log_failure("cudaEventDestroy", [e] { POOLSCOPE_DARRAY_CHECK(cudaEventDestroy(e)); });
  POOLSCOPE_DARRAY_CHECK(waited);
}
}  // namespace

mpi_staging::mpi_staging(std::shared_ptr<process_group> group, std::vector<int> ordinals)
    : group_(std::move(group)),
      ordinals_(std::move(ordinals)),
      pinned_(pool::make_resource("pinned")),
      // A caching pool: pinning host memory costs milliseconds per large block, and a reshard's
      // pieces come back with the same sizes.
      pool_(pool::make_allocator("bfc", *pinned_)) {
  for (std::size_t d = 0; d < ordinals_.size(); ++d) {
    workers_.push_back(std::make_unique<ordered_worker>(
        "darray " + group_->describe() + ", sends by MPI from GPU " + std::to_string(d)));
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

cudaEvent_t mpi_staging::mark(int ordinal, cudaStream_t s) {
  const device_guard guard(ordinal);
  cudaEvent_t e = nullptr;
  POOLSCOPE_DARRAY_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(e, s);
  if (recorded != cudaSuccess) {
    log_failure("cudaEventDestroy", [e] { POOLSCOPE_DARRAY_CHECK(cudaEventDestroy(e)); });
    seam::raise(recorded, "cudaEventRecord(e, s)", __FILE__, __LINE__);
  }
  return e;
}

void mpi_staging::send(int device, cudaStream_t s, const void* src, std::size_t bytes, int peer,
                       int tag, const std::string& what) {
  const int ordinal = ordinals_.at(static_cast<std::size_t>(device));
  auto host = take(bytes);
  {
    const device_guard guard(ordinal);
    POOLSCOPE_DARRAY_CHECK(cudaMemcpyAsync(host->data(), src, bytes, cudaMemcpyDeviceToHost, s));
  }
  const cudaEvent_t copied = mark(ordinal, s);
  workers_[static_cast<std::size_t>(device)]->push(
      [g = group_, host = std::move(host), copied, bytes, peer, tag, what] {
        finish(copied);
        try {
          g->send(host->data(), bytes, peer, tag);
        } catch (const std::exception& e) {
          throw communication_error(what + ": " + e.what());
        }
      });
}

void mpi_staging::receive(int device, cudaStream_t s, void* dst, std::size_t bytes, int peer,
                          int tag, const std::string& what) {
  const int ordinal = ordinals_.at(static_cast<std::size_t>(device));
  auto host = take(bytes);
  try {
    group_->receive(host->data(), bytes, peer, tag);
  } catch (const std::exception& e) {
    throw communication_error(what + ": " + e.what());
  }
  {
    const device_guard guard(ordinal);
    POOLSCOPE_DARRAY_CHECK(cudaMemcpyAsync(dst, host->data(), bytes, cudaMemcpyHostToDevice, s));
  }
  // The staging goes back to the pool once the copy has read it: the worker waits for that (in
  // its order, behind the sends handed to it before, which wait only for GPU work and peers).
  const cudaEvent_t copied = mark(ordinal, s);
  workers_[static_cast<std::size_t>(device)]->push([host = std::move(host), copied]() mutable {
    finish(copied);
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

}  // namespace poolscope::darray::detail
