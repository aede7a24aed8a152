// The MPI seam (mpi_seam.hpp): the only file of darray that includes <mpi.h>.
#include "mpi_seam.hpp"

#include <chrono>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/log.hpp"

#ifdef POOLSCOPE_HAVE_MPI
#include <mpi.h>
#endif

namespace poolscope::darray::detail::mpi {

std::pair<int, std::string> launcher_world_size() {
  // Open MPI's mpirun, MPICH/Intel's Hydra (PMI), SLURM's srun, torchrun / PyTorch launchers.
  // SLURM's job step, not its allocation: SLURM_NTASKS is set in salloc's shell and sbatch's
  // script too, where one process runs alone until srun starts the ranks.
  for (const char* name :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "WORLD_SIZE"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (end != nullptr && *end == '\0' && n > 0 && n < (1L << 30)) {
        return {static_cast<int>(n), name};
      }
    }
  }
  return {0, {}};
}

#ifndef POOLSCOPE_HAVE_MPI

namespace {
[[noreturn]] void no_mpi() {
  throw communication_error(
      "darray: poolscope was built without MPI, so it cannot join the other ranks of a launch "
      "(install libopenmpi-dev and openmpi-bin, then configure again: CMake's find_package(MPI) "
      "finds them)");
}
}  // namespace

struct request::state {};
struct world::impl {};

bool available() noexcept {
  return false;
}
request::request() noexcept = default;
request::request(request&&) noexcept = default;
request& request::operator=(request&&) noexcept = default;
request::~request() = default;
bool request::done() const noexcept {
  return true;
}
world::world() noexcept = default;
world::~world() = default;
std::unique_ptr<world> world::make() {
  no_mpi();
}
std::string world::processor_name() const {
  no_mpi();
}
request world::isend(const void*, std::size_t, int, int) {
  no_mpi();
}
request world::irecv(void*, std::size_t, int, int) {
  no_mpi();
}
request world::ibarrier() {
  no_mpi();
}
request world::ibcast(void*, std::size_t, int) {
  no_mpi();
}
request world::iallgather(const void*, std::size_t, void*) {
  no_mpi();
}
request world::iallreduce(const std::int64_t*, std::int64_t*, int, reduce_kind) {
  no_mpi();
}
bool world::test(request&, std::size_t*) {
  no_mpi();
}
void world::cancel(request&) noexcept {}
void world::post_notice(int, const std::string&) {
  no_mpi();
}
std::optional<std::pair<int, std::string>> world::take_notice() {
  return std::nullopt;
}
void abort_job(int code) noexcept {
  std::_Exit(code);
}

#else  // POOLSCOPE_HAVE_MPI

namespace {

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error " + std::to_string(code);
  }
  return std::string(text, static_cast<std::size_t>(length));
}

[[noreturn]] void raise(int code, const char* call, const char* file, int line) {
  throw communication_error("darray: " + std::string(call) + " failed at " + file + ":" +
                            std::to_string(line) + ": " + error_text(code));
}

// An MPI count of `bytes`: MPI counts are int (MPI 4's large counts are not in Open MPI 4).
int count_of(std::size_t bytes, const char* what) {
  if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw communication_error("darray: " + std::string(what) + " of " + format_bytes(bytes) +
                              " exceeds MPI's int count (2 GiB - 1 bytes per message)");
  }
  return static_cast<int>(bytes);
}

// The worlds alive in this process, and whether the first one initialized MPI (guarded by
// lifetime_mutex).
std::mutex lifetime_mutex;
int worlds_alive = 0;
bool initialized_here = false;

}  // namespace

#define POOLSCOPE_MPI_CHECK(call)                                                                \
  do {                                                                                           \
    const int poolscope_mpi_status_ = (call);                                                    \
    if (poolscope_mpi_status_ != MPI_SUCCESS) [[unlikely]] {                                     \
      ::poolscope::darray::detail::mpi::raise(poolscope_mpi_status_, #call, __FILE__, __LINE__); \
    }                                                                                            \
  } while (false)

struct request::state {
  MPI_Request handle = MPI_REQUEST_NULL;
};

struct world::impl {
  MPI_Comm data = MPI_COMM_NULL;
  MPI_Comm notices = MPI_COMM_NULL;
  std::mutex notice_mutex;
  // The notices sent, each text beside its request (MPI reads it until the send completes).
  struct sent_notice {
    std::unique_ptr<std::string> text;
    request pending;
  };
  std::vector<sent_notice> notices_sent;  // notice_mutex
};

bool available() noexcept {
  return true;
}

request::request() noexcept = default;
request::request(request&&) noexcept = default;
request& request::operator=(request&&) noexcept = default;

request::~request() {
  if (s && s->handle != MPI_REQUEST_NULL) {
    int finalized = 0;
    if (MPI_Finalized(&finalized) == MPI_SUCCESS && finalized == 0) {
      // Cancelled and released: only failure paths drop a pending request.
      (void)MPI_Cancel(&s->handle);
      (void)MPI_Request_free(&s->handle);
    }
  }
}

bool request::done() const noexcept {
  return !s || s->handle == MPI_REQUEST_NULL;
}

world::world() noexcept : impl_(std::make_unique<impl>()) {}

std::unique_ptr<world> world::make() {
  const std::lock_guard lock(lifetime_mutex);
  int initialized = 0;
  POOLSCOPE_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized == 0) {
    int finalized = 0;
    POOLSCOPE_MPI_CHECK(MPI_Finalized(&finalized));
    if (finalized != 0) {
      throw communication_error(
          "darray: MPI was finalized in this process; a process group cannot be made again");
    }
    int provided = 0;
    POOLSCOPE_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    initialized_here = true;
  }
  int provided = 0;
  POOLSCOPE_MPI_CHECK(MPI_Query_thread(&provided));
  if (provided < MPI_THREAD_MULTIPLE) {
    throw communication_error(
        "darray: MPI provides thread level " + std::to_string(provided) +
        ", and darray needs MPI_THREAD_MULTIPLE (host devices' transfer workers call MPI beside "
        "the caller's thread): initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)");
  }
  std::unique_ptr<world> w(new world());
  impl& m = *w->impl_;
  POOLSCOPE_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &m.data));
  try {
    POOLSCOPE_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &m.notices));
    POOLSCOPE_MPI_CHECK(MPI_Comm_set_errhandler(m.data, MPI_ERRORS_RETURN));
    POOLSCOPE_MPI_CHECK(MPI_Comm_set_errhandler(m.notices, MPI_ERRORS_RETURN));
    POOLSCOPE_MPI_CHECK(MPI_Comm_rank(m.data, &w->rank_));
    POOLSCOPE_MPI_CHECK(MPI_Comm_size(m.data, &w->size_));
  } catch (...) {
    (void)MPI_Comm_free(&m.data);
    if (m.notices != MPI_COMM_NULL) {
      (void)MPI_Comm_free(&m.notices);
    }
    throw;
  }
  ++worlds_alive;
  return w;
}

world::~world() {
  const std::lock_guard lock(lifetime_mutex);
  int finalized = 0;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized != 0) {
    return;  // the application finalized MPI first: nothing of ours is left to free
  }
  {
    const std::lock_guard notices(impl_->notice_mutex);
    for (impl::sent_notice& n : impl_->notices_sent) {
      cancel(n.pending);
    }
    impl_->notices_sent.clear();
  }
  for (MPI_Comm* c : {&impl_->data, &impl_->notices}) {
    if (*c != MPI_COMM_NULL) {
      if (const int s = MPI_Comm_free(c); s != MPI_SUCCESS) {
        poolscope::log(log_level::warn, "darray: MPI_Comm_free failed: " + error_text(s));
      }
    }
  }
  if (--worlds_alive == 0 && initialized_here) {
    initialized_here = false;
    if (const int s = MPI_Finalize(); s != MPI_SUCCESS) {
      poolscope::log(log_level::warn, "darray: MPI_Finalize failed: " + error_text(s));
    }
  }
}

std::string world::processor_name() const {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  POOLSCOPE_MPI_CHECK(MPI_Get_processor_name(name, &length));
  return std::string(name, static_cast<std::size_t>(length));
}

namespace {
request make_request() {
  request r;
  r.s = std::make_unique<request::state>();
  return r;
}
MPI_Op op_of(reduce_kind op) noexcept {
  switch (op) {
    case reduce_kind::sum:
      return MPI_SUM;
    case reduce_kind::max:
      return MPI_MAX;
    case reduce_kind::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}
}  // namespace

request world::isend(const void* data, std::size_t bytes, int peer, int tag) {
  request r = make_request();
  POOLSCOPE_MPI_CHECK(
      MPI_Isend(data, count_of(bytes, "a send"), MPI_BYTE, peer, tag, impl_->data, &r.s->handle));
  return r;
}

request world::irecv(void* data, std::size_t bytes, int peer, int tag) {
  request r = make_request();
  POOLSCOPE_MPI_CHECK(MPI_Irecv(data, count_of(bytes, "a receive"), MPI_BYTE, peer, tag,
                                impl_->data, &r.s->handle));
  return r;
}

request world::ibarrier() {
  request r = make_request();
  POOLSCOPE_MPI_CHECK(MPI_Ibarrier(impl_->data, &r.s->handle));
  return r;
}

request world::ibcast(void* data, std::size_t bytes, int root) {
  request r = make_request();
  POOLSCOPE_MPI_CHECK(
      MPI_Ibcast(data, count_of(bytes, "a broadcast"), MPI_BYTE, root, impl_->data, &r.s->handle));
  return r;
}

request world::iallgather(const void* in, std::size_t bytes, void* out) {
  request r = make_request();
  const int n = count_of(bytes, "an all-gather");
  POOLSCOPE_MPI_CHECK(MPI_Iallgather(in, n, MPI_BYTE, out, n, MPI_BYTE, impl_->data, &r.s->handle));
  return r;
}

request world::iallreduce(const std::int64_t* in, std::int64_t* out, int count, reduce_kind op) {
  request r = make_request();
  POOLSCOPE_MPI_CHECK(
      MPI_Iallreduce(in, out, count, MPI_INT64_T, op_of(op), impl_->data, &r.s->handle));
  return r;
}

bool world::test(request& r, std::size_t* received) {
  if (r.done()) {
    return true;
  }
  int flag = 0;
  MPI_Status status{};
  POOLSCOPE_MPI_CHECK(MPI_Test(&r.s->handle, &flag, &status));
  if (flag == 0) {
    return false;
  }
  if (received != nullptr) {
    int count = 0;
    POOLSCOPE_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
    *received = static_cast<std::size_t>(count);
  }
  return true;
}

void world::cancel(request& r) noexcept {
  if (r.done()) {
    return;
  }
  // A receive cancels at once; a send MPI may no longer take back completes on its own (or never,
  // when its peer is gone): wait a little, then let MPI release it whenever it ends.
  (void)MPI_Cancel(&r.s->handle);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  int flag = 0;
  while (MPI_Test(&r.s->handle, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag == 0 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (r.s->handle != MPI_REQUEST_NULL) {
    (void)MPI_Request_free(&r.s->handle);
  }
}

void world::post_notice(int peer, const std::string& text) {
  const std::lock_guard lock(impl_->notice_mutex);
  impl::sent_notice n{std::make_unique<std::string>(text), make_request()};
  POOLSCOPE_MPI_CHECK(MPI_Isend(n.text->data(), count_of(n.text->size(), "a failure notice"),
                                MPI_CHAR, peer, 0, impl_->notices, &n.pending.s->handle));
  impl_->notices_sent.push_back(std::move(n));
}

std::optional<std::pair<int, std::string>> world::take_notice() {
  int flag = 0;
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status{};
  POOLSCOPE_MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, 0, impl_->notices, &flag, &message, &status));
  if (flag == 0) {
    return std::nullopt;
  }
  int count = 0;
  POOLSCOPE_MPI_CHECK(MPI_Get_count(&status, MPI_CHAR, &count));
  std::string text(static_cast<std::size_t>(count), '\0');
  POOLSCOPE_MPI_CHECK(MPI_Mrecv(text.data(), count, MPI_CHAR, &message, MPI_STATUS_IGNORE));
  return std::make_pair(status.MPI_SOURCE, std::move(text));
}

void abort_job(int code) noexcept {
  int initialized = 0;
  int finalized = 0;
  if (MPI_Initialized(&initialized) == MPI_SUCCESS && initialized != 0 &&
      MPI_Finalized(&finalized) == MPI_SUCCESS && finalized == 0) {
    (void)MPI_Abort(MPI_COMM_WORLD, code);
  }
  std::_Exit(code);  // no MPI running, or MPI_Abort returned (it should not): end this rank
}

#endif  // POOLSCOPE_HAVE_MPI

}  // namespace poolscope::darray::detail::mpi
