// process_group (process_group.hpp): the factories, the bounded waits and the failure notices.
// Every MPI call goes through mpi_seam.hpp.
#include "poolscope/darray/process_group.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "mpi_seam.hpp"
#include "poolscope/error.hpp"
#include "poolscope/log.hpp"

namespace poolscope::darray {
namespace {

// The largest message the seam is given: MPI counts are int; larger transfers go as several
// messages of one tag (which arrive in order).
constexpr std::size_t max_message_bytes = std::size_t{1} << 30;
constexpr int max_tag = 32767;  // the least MPI_TAG_UB MPI guarantees

std::chrono::milliseconds resolve_timeout(std::chrono::milliseconds asked) {
  if (asked.count() > 0) {
    return asked;
  }
  if (asked.count() < 0) {
    throw invalid_argument("darray process group: timeout " + std::to_string(asked.count()) +
                           " ms is negative");
  }
  if (const char* env = std::getenv("POOLSCOPE_RANK_TIMEOUT"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const double seconds = std::strtod(env, &end);
    if (end == nullptr || *end != '\0' || !(seconds > 0.0) || seconds > 1e6) {
      throw invalid_argument("darray process group: POOLSCOPE_RANK_TIMEOUT '" + std::string(env) +
                             "' is not a number of seconds in (0, 1e6]");
    }
    return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0 + 0.5));
  }
  return std::chrono::seconds(300);
}

std::string seconds_text(std::chrono::milliseconds t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

// Waits between polls: none for the first second, then sleeps growing to a millisecond (a rank
// far behind costs no core). MPI progresses only inside its calls: a large message between ranks
// of one host moves a fragment of shared memory per poll, so a sleep between polls throttles the
// transfer itself (hundreds of MiB at a millisecond per fragment take seconds), while polling
// without sleeping moves it at memory speed, as a blocking MPI_Wait would.
class backoff {
 public:
  void pause() {
    const auto waited = std::chrono::steady_clock::now() - start_;
    if (waited < std::chrono::seconds(1)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::microseconds sleep_{20};
};

}  // namespace

process_group::process_group(token, int rank, int size, std::unique_ptr<detail::mpi::world> world,
                             void* nccl_comm, std::chrono::milliseconds timeout)
    : rank_(rank),
      size_(size),
      world_(std::move(world)),
      nccl_comm_(nccl_comm),
      timeout_(timeout) {}

process_group::~process_group() = default;

std::shared_ptr<process_group> process_group::single() {
  return std::make_shared<process_group>(token{}, 0, 1, nullptr, nullptr,
                                         resolve_timeout(std::chrono::milliseconds(0)));
}

std::shared_ptr<process_group> process_group::from_mpi(const process_group_options& options) {
  // One group per process, alive until exit: MPI is initialized once and finalized once.
  static std::mutex mutex;
  static std::shared_ptr<process_group> world_group;
  const std::lock_guard lock(mutex);
  if (!world_group) {
    const auto timeout = resolve_timeout(options.timeout);
    auto w = detail::mpi::world::make();
    const int rank = w->rank();
    const int size = w->size();
    auto g = std::make_shared<process_group>(token{}, rank, size, std::move(w), nullptr, timeout);
    // The ranks on this host, in rank order (which GPUs each takes: make_cuda_backend).
    const std::vector<std::string> hosts = g->all_gather(g->host_name());
    const std::string& mine = hosts[static_cast<std::size_t>(rank)];
    g->local_rank_ = static_cast<int>(std::count(hosts.begin(), hosts.begin() + rank, mine));
    g->local_size_ = static_cast<int>(std::count(hosts.begin(), hosts.end(), mine));
    world_group = std::move(g);
  }
  return world_group;
}

std::shared_ptr<process_group> process_group::from_launcher(const process_group_options& options) {
  const auto [size, variable] = detail::mpi::launcher_world_size();
  if (size == 0) {
    return single();
  }
  if (!detail::mpi::available()) {
    if (size == 1) {
      return single();
    }
    throw communication_error("darray: a launcher started " + std::to_string(size) + " ranks (" +
                              variable + "=" + std::to_string(size) +
                              "), and poolscope was built without MPI, so each would run alone "
                              "(install libopenmpi-dev and openmpi-bin, then configure again)");
  }
  auto g = from_mpi(options);
  if (g->size() != size) {
    // The environment names a launch MPI does not know: the process was not started by an MPI
    // launcher (torchrun sets WORLD_SIZE), or its peers never were.
    throw communication_error(
        "darray: " + variable + "=" + std::to_string(size) + " says this process is one of " +
        std::to_string(size) + " ranks, and MPI_COMM_WORLD has " + std::to_string(g->size()) +
        ": start it with mpirun or srun (a launcher without MPI, as torchrun: adopt the "
        "application's NCCL communicator, process_group::adopt_nccl)");
  }
  return g;
}

std::shared_ptr<process_group> process_group::adopt_nccl(void* nccl_comm, int rank, int size,
                                                         const process_group_options& options) {
  if (nccl_comm == nullptr) {
    throw invalid_argument("darray process_group::adopt_nccl: the NCCL communicator is null");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    throw invalid_argument("darray process_group::adopt_nccl: rank " + std::to_string(rank) +
                           " is not one of the " + std::to_string(size) + " ranks");
  }
  return std::make_shared<process_group>(token{}, rank, size, nullptr, nccl_comm,
                                         resolve_timeout(options.timeout));
}

int process_group::launched() noexcept {
  try {
    return detail::mpi::launcher_world_size().first;
  } catch (...) {
    return 0;
  }
}

std::string process_group::host_name() const {
  if (world_) {
    return world_->processor_name();
  }
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) {
    return "unknown host";
  }
  return name;
}

std::string process_group::describe() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_);
}

detail::mpi::world& process_group::mpi(const char* what) const {
  if (!world_) {
    throw logic_error(std::string("darray process group: ") + what + " needs MPI, and " +
                      describe() + " was " +
                      (nccl_comm_ != nullptr ? "adopted from an NCCL communicator" : "made alone"));
  }
  return *world_;
}

std::string process_group::note_failure(const std::string& why) {
  const std::lock_guard lock(failure_mutex_);
  if (!failure_) {
    failure_ = why;
  }
  return *failure_;
}

std::optional<std::string> process_group::failure() const {
  const std::lock_guard lock(failure_mutex_);
  return failure_;
}

std::optional<std::string> process_group::poll_failure() {
  if (world_) {
    if (auto notice = world_->take_notice()) {
      note_failure("rank " + std::to_string(notice->first) + " failed: " + notice->second);
    }
  }
  return failure();
}

void process_group::check_failed() {
  if (auto f = poll_failure()) {
    throw communication_error("darray " + describe() + ": " + *f);
  }
}

template <typename Request>
void process_group::wait_for(Request& r, const std::string& what, int peer, std::size_t* received) {
  detail::mpi::world& w = *world_;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  backoff pause;
  try {
    for (;;) {
      bool done = false;
      try {
        done = w.test(r, received);
      } catch (const communication_error& e) {
        fail(describe() + ": " + e.what());  // an MPI error here: the others stop waiting for us
        throw;
      }
      if (done) {
        return;
      }
      check_failed();
      if (std::chrono::steady_clock::now() >= deadline) {
        const std::string who = peer >= 0 ? "rank " + std::to_string(peer) : "every rank";
        const std::string why = describe() + " waited " + seconds_text(timeout_) + " for " + who +
                                " while " + what +
                                " (POOLSCOPE_RANK_TIMEOUT sets the bound); did it fail, or do the "
                                "ranks run different programs?";
        fail(why);
        throw communication_error("darray " + why);
      }
      pause.pause();
    }
  } catch (...) {
    w.cancel(r);
    throw;
  }
}

void process_group::barrier() {
  check_failed();
  if (size_ == 1 && !world_) {
    return;
  }
  auto r = mpi("barrier").ibarrier();
  wait_for(r, "in a barrier", -1);
}

void process_group::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size_) {
    throw invalid_argument("darray process group broadcast: root " + std::to_string(root) +
                           " is not a rank of " + std::to_string(size_));
  }
  check_failed();
  if (size_ == 1 && !world_) {
    return;
  }
  detail::mpi::world& w = mpi("broadcast");
  auto* p = static_cast<std::byte*>(data);
  std::size_t done = 0;
  do {
    const std::size_t n = std::min(bytes - done, max_message_bytes);
    auto r = w.ibcast(p + done, n, root);
    wait_for(r, "broadcasting " + format_bytes(bytes) + " from rank " + std::to_string(root), -1);
    done += n;
  } while (done < bytes);
}

std::vector<std::int64_t> process_group::all_gather(std::int64_t value) {
  check_failed();
  if (size_ == 1 && !world_) {
    return {value};
  }
  std::vector<std::int64_t> out(static_cast<std::size_t>(size_));
  auto r = mpi("all_gather").iallgather(&value, sizeof value, out.data());
  wait_for(r, "gathering a value of every rank", -1);
  return out;
}

std::vector<std::string> process_group::all_gather(const std::string& text) {
  check_failed();
  if (size_ == 1 && !world_) {
    return {text};
  }
  const auto lengths = all_gather(static_cast<std::int64_t>(text.size()));
  const auto longest = static_cast<std::size_t>(
      std::max<std::int64_t>(1, *std::max_element(lengths.begin(), lengths.end())));
  std::string mine = text;
  mine.resize(longest, '\0');
  std::string all(longest * static_cast<std::size_t>(size_), '\0');
  auto r = mpi("all_gather").iallgather(mine.data(), longest, all.data());
  wait_for(r, "gathering a text of every rank", -1);
  std::vector<std::string> out;
  for (int i = 0; i < size_; ++i) {
    out.push_back(all.substr(static_cast<std::size_t>(i) * longest,
                             static_cast<std::size_t>(lengths[static_cast<std::size_t>(i)])));
  }
  return out;
}

std::vector<std::int64_t> process_group::all_reduce(const std::vector<std::int64_t>& values,
                                                    reduction op) {
  check_failed();
  if (size_ == 1 && !world_) {
    return values;
  }
  std::vector<std::int64_t> out(values.size());
  const detail::mpi::reduce_kind kind = op == reduction::sum   ? detail::mpi::reduce_kind::sum
                                        : op == reduction::max ? detail::mpi::reduce_kind::max
                                                               : detail::mpi::reduce_kind::min;
  auto r = mpi("all_reduce")
               .iallreduce(values.data(), out.data(), static_cast<int>(values.size()), kind);
  wait_for(r, "reducing values of every rank", -1);
  return out;
}

namespace {
void check_peer(int peer, int tag, int rank, int size, const char* what) {
  if (peer < 0 || peer >= size || peer == rank) {
    throw invalid_argument(std::string("darray process group ") + what + ": peer " +
                           std::to_string(peer) + " is not another rank of " +
                           std::to_string(size) + " (this is rank " + std::to_string(rank) + ")");
  }
  if (tag < 0 || tag > max_tag) {
    throw invalid_argument(std::string("darray process group ") + what + ": tag " +
                           std::to_string(tag) + " is outside 0.." + std::to_string(max_tag));
  }
}
}  // namespace

void process_group::send(const void* data, std::size_t bytes, int peer, int tag) {
  check_peer(peer, tag, rank_, size_, "send");
  detail::mpi::world& w = mpi("send");
  check_failed();
  const auto* p = static_cast<const std::byte*>(data);
  std::size_t done = 0;
  do {
    const std::size_t n = std::min(bytes - done, max_message_bytes);
    auto r = w.isend(p + done, n, peer, tag);
    wait_for(r, "sending " + format_bytes(bytes) + " to it (tag " + std::to_string(tag) + ")",
             peer);
    done += n;
  } while (done < bytes);
}

void process_group::receive(void* data, std::size_t bytes, int peer, int tag) {
  check_peer(peer, tag, rank_, size_, "receive");
  detail::mpi::world& w = mpi("receive");
  check_failed();
  auto* p = static_cast<std::byte*>(data);
  std::size_t done = 0;
  do {
    const std::size_t n = std::min(bytes - done, max_message_bytes);
    // A longer message fails the receive (MPI's truncation error); a shorter one is caught here.
    std::size_t got = 0;
    auto r = w.irecv(p + done, n, peer, tag);
    wait_for(r, "receiving " + format_bytes(bytes) + " from it (tag " + std::to_string(tag) + ")",
             peer, &got);
    if (got != n) {
      const std::string why = describe() + " expected " + format_bytes(n) + " from rank " +
                              std::to_string(peer) + " (tag " + std::to_string(tag) + "), got " +
                              format_bytes(got) + ": do the ranks run the same program?";
      fail(why);
      throw communication_error("darray " + why);
    }
    done += n;
  } while (done < bytes);
}

void process_group::fail(const std::string& why) noexcept {
  try {
    note_failure(why);
    if (!world_) {
      return;
    }
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) {
        world_->post_notice(peer, why);
      }
    }
  } catch (const std::exception& e) {
    poolscope::log(log_level::error, "darray " + describe() +
                                         ": could not tell the other ranks of a failure (" +
                                         e.what() + "): " + why);
  } catch (...) {
    poolscope::log(log_level::error,
                   "darray " + describe() + ": could not tell the other ranks of a failure");
  }
}

void process_group::abort_launch(const std::string& why, int code) noexcept {
  try {
    const std::string line = "poolscope: " + why + "; ending every rank of the launch\n";
    (void)!::write(2, line.data(), line.size());
  } catch (...) {  // no memory for the line: end all the same
  }
  detail::mpi::abort_job(code);
}

}  // namespace poolscope::darray
