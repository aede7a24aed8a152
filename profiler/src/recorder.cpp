#include "poolscope/profiler/recorder.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "detail/recorder_crash.hpp"
#include "poolscope/error.hpp"
#include "poolscope/log.hpp"

namespace poolscope::profiler {

std::string_view action_name(hooks::event_kind k) noexcept {
  switch (k) {
    case hooks::event_kind::pool_malloc:
      return "malloc";
    case hooks::event_kind::pool_free:
      return "free";
    case hooks::event_kind::device_alloc:
      return "device_alloc";
    case hooks::event_kind::device_free:
      return "device_free";
    case hooks::event_kind::split:
      return "split";
    case hooks::event_kind::merge:
      return "merge";
    case hooks::event_kind::release:
      return "release";
    case hooks::event_kind::oom:
      return "oom";
    case hooks::event_kind::limit_hit:
      return "limit_hit";
    case hooks::event_kind::invalid_free:
      return "invalid_free";
    case hooks::event_kind::segment_map:
      return "segment_map";
    case hooks::event_kind::segment_unmap:
      return "segment_unmap";
  }
  return "unknown";
}

namespace {

constexpr std::size_t min_buffer_bytes = 4096;
constexpr std::size_t max_buffer_bytes = std::size_t{1} << 30;  // offsets fit in 32 bits
constexpr std::size_t max_line_bytes = 1024;

// ---- fatal-signal flushing -------------------------------------------------------------------

constexpr std::array<int, 5> fatal_signals = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
constexpr int registry_slots = 32;

std::atomic<recorder::crash_view*> g_views[registry_slots];
struct sigaction g_previous[fatal_signals.size()];
std::atomic<bool> g_handlers_installed{false};
std::mutex g_install_mutex;

// Async-signal-safe: atomics and write(2) only.
void write_all(int fd, const char* data, std::size_t n) noexcept {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) {
        continue;
      }
      return;
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
}

std::atomic<detail::recorder_write_function> g_write{nullptr};  // null: ::write

// Set by the first crash flush: from then on no recorder reuses its buffer (a flush on another
// thread may still be writing from it).
std::atomic<bool> g_crashing{false};

// crash_view::state: bytes handed to a write (high half), bytes of complete lines (low half).
constexpr std::uint64_t pack_state(std::size_t claimed, std::size_t committed) noexcept {
  return (static_cast<std::uint64_t>(claimed) << 32) | committed;
}
constexpr std::size_t claimed_of(std::uint64_t state) noexcept {
  return static_cast<std::size_t>(state >> 32);
}
constexpr std::size_t committed_of(std::uint64_t state) noexcept {
  return static_cast<std::size_t>(state & 0xFFFF'FFFFU);
}

// Async-signal-safe (a system call), unlike a thread_local in a library that may be dlopen'ed.
long current_thread() noexcept {
  return ::syscall(SYS_gettid);
}

void flush_views_for_crash() noexcept {
  g_crashing.store(true, std::memory_order_seq_cst);
  const long me = current_thread();
  for (auto& slot : g_views) {
    recorder::crash_view* v = slot.load(std::memory_order_acquire);
    if (v == nullptr) {
      continue;
    }
    std::uint64_t state = v->state.load(std::memory_order_seq_cst);
    // This thread was in the recorder's write, which will never finish: write the rest of its
    // range (once it has taken it; before that the claim below takes the whole range). Another
    // thread's write is left to that thread: writing its range here too would duplicate it.
    if (v->writer.load(std::memory_order_seq_cst) == me) {
      const std::size_t end = v->writer_end.load(std::memory_order_relaxed);
      const std::size_t done = v->writer_done.load(std::memory_order_relaxed);
      if (claimed_of(state) >= end && end > done) {
        write_all(v->fd, v->buffer + done, end - done);
        v->writer_done.store(end, std::memory_order_relaxed);
      }
    }
    while (claimed_of(state) < committed_of(state)) {
      const std::size_t from = claimed_of(state);
      const std::size_t to = committed_of(state);
      if (v->state.compare_exchange_weak(state, pack_state(to, to), std::memory_order_seq_cst)) {
        write_all(v->fd, v->buffer + from, to - from);
        break;
      }
    }
  }
}

void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  detail::flush_recorders_for_fatal_signal();
  errno = saved_errno;
  std::size_t i = 0;
  while (i < fatal_signals.size() && fatal_signals[i] != sig) {
    ++i;
  }
  if (i == fatal_signals.size()) {
    return;
  }
  const struct sigaction& prev = g_previous[i];
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, context);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // Default action: put it back and deliver the signal again. It is blocked while this handler
  // runs, so it arrives as soon as the handler returns (a fault re-executes and faults again).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);
}

void install_handlers_once() {
  std::lock_guard lock(g_install_mutex);
  if (g_handlers_installed.load(std::memory_order_relaxed)) {
    return;
  }
  for (std::size_t i = 0; i < fatal_signals.size(); ++i) {
    struct sigaction sa {};
    sa.sa_sigaction = &on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(fatal_signals[i], &sa, &g_previous[i]);
  }
  g_handlers_installed.store(true, std::memory_order_release);
}

int register_view(recorder::crash_view* v) noexcept {
  for (int i = 0; i < registry_slots; ++i) {
    recorder::crash_view* expected = nullptr;
    if (g_views[i].compare_exchange_strong(expected, v, std::memory_order_acq_rel)) {
      return i;
    }
  }
  return -1;
}

// ---- line formatting -------------------------------------------------------------------------

/// JSON string body of an allocator name: escaped, ASCII only, at most 128 bytes.
void escape_name(const char* name, char* out, std::size_t cap) noexcept {
  std::size_t n = 0;
  for (const char* p = name != nullptr ? name : ""; *p != '\0' && n + 7 < cap && n < 128; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    if (c == '"' || c == '\\') {
      out[n++] = '\\';
      out[n++] = static_cast<char>(c);
    } else if (c < 0x20) {
      n += static_cast<std::size_t>(std::snprintf(out + n, cap - n, "\\u%04x", c));
    } else if (c >= 0x80) {
      out[n++] = '?';  // keep every line valid UTF-8 whatever the name holds
    } else {
      out[n++] = static_cast<char>(c);
    }
  }
  out[n] = '\0';
}

// What a recorder writes: every event with all_phases; otherwise allocations and releases
// when done (post), frees before the memory is reusable (pre), every phase of the other kinds.
constexpr hooks::event_filter recorded(bool all_phases) noexcept {
  using hooks::event_kind;
  using hooks::event_phase;
  hooks::event_filter f = hooks::event_filter::all();
  if (!all_phases) {
    for (event_kind k : {event_kind::pool_malloc, event_kind::device_alloc, event_kind::segment_map,
                         event_kind::release}) {
      f.remove(k, event_phase::pre).remove(k, event_phase::instant);
    }
    for (event_kind k :
         {event_kind::pool_free, event_kind::device_free, event_kind::segment_unmap}) {
      f.remove(k, event_phase::post).remove(k, event_phase::instant);
    }
  }
  return f;
}

// Both filters computed once, at compile time: on_event tests one of them per event.
constexpr hooks::event_filter recorded_all = recorded(true);
constexpr hooks::event_filter recorded_usual = recorded(false);

bool wanted(const hooks::event& e, bool all_phases) noexcept {
  return (all_phases ? recorded_all : recorded_usual).contains(e.kind, e.phase);
}

std::size_t format_line(const hooks::event& e, char* out, std::size_t cap) noexcept {
  char name[160];
  escape_name(e.allocator_name, name, sizeof name);
  const std::string_view action = action_name(e.kind);
  const std::string_view phase = hooks::to_string(e.phase);
  const int n = std::snprintf(
      out, cap,
      "{\"seq\":%" PRIu64 ",\"time_ns\":%" PRIu64 ",\"thread\":%" PRIu64
      ",\"device\":%d,\"stream\":\"0x%" PRIxPTR "\",\"allocator\":\"%s\",\"allocator_id\":%" PRIu32
      ",\"action\":\"%.*s\",\"phase\":\"%.*s\",\"ptr\":\"0x%" PRIxPTR
      "\",\"size\":%zu"
      ",\"rounded\":%zu}\n",
      e.seq, e.time_ns, e.thread, e.device, reinterpret_cast<std::uintptr_t>(e.stream), name,
      e.allocator_id, static_cast<int>(action.size()), action.data(),
      static_cast<int>(phase.size()), phase.data(), reinterpret_cast<std::uintptr_t>(e.ptr),
      e.requested, e.rounded);
  if (n <= 0 || static_cast<std::size_t>(n) >= cap) {
    return 0;
  }
  return static_cast<std::size_t>(n);
}

}  // namespace

namespace detail {

void set_recorder_write_for_testing(recorder_write_function f) noexcept {
  g_write.store(f, std::memory_order_relaxed);
}

void flush_recorders_for_fatal_signal() noexcept {
  flush_views_for_crash();
}

void forget_fatal_signal_for_testing() noexcept {
  g_crashing.store(false, std::memory_order_seq_cst);
}

}  // namespace detail

recorder::recorder(const std::string& path, const recorder_options& options)
    : path_(path), options_(options) {
  capacity_ = std::clamp(options_.buffer_bytes, min_buffer_bytes, max_buffer_bytes);
  buffer_ = std::make_unique<char[]>(capacity_);
  view_ = std::make_unique<crash_view>();
  view_->buffer = buffer_.get();
  view_->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (view_->fd < 0) {
    const int err = errno;
    throw runtime_error("poolscope: cannot create event log '" + path + "': " + std::strerror(err));
  }
  char header[128];
  const int n = std::snprintf(header, sizeof header,
                              "{\"format\":\"poolscope.events\",\"version\":1,\"pid\":%ld}\n",
                              static_cast<long>(::getpid()));
  std::memcpy(buffer_.get(), header, static_cast<std::size_t>(n));
  view_->state.store(pack_state(0, static_cast<std::size_t>(n)), std::memory_order_release);
  if (options_.flush_on_fatal_signal) {
    install_handlers_once();
    slot_ = register_view(view_.get());
    if (slot_ < 0) {
      log(log_level::warn, "recorder: more than 32 recorders alive; '" + path +
                               "' will not be flushed on a fatal signal");
    }
  }
}

recorder::~recorder() {
  if (slot_ >= 0) {
    g_views[slot_].store(nullptr, std::memory_order_release);
  }
  {
    std::lock_guard lock(mutex_);
    if (!failed_.load(std::memory_order_relaxed)) {
      write_buffer_locked();
    }
  }
  ::close(view_->fd);
}

void recorder::fail(const char* what, int err) noexcept {
  if (!failed_.exchange(true, std::memory_order_relaxed)) {
    char message[512];
    std::snprintf(message, sizeof message, "recorder disabled: %s '%s': %s", what, path_.c_str(),
                  std::strerror(err));
    log(log_level::error, message);
  }
}

bool recorder::write_buffer_locked() noexcept {
  crash_view& v = *view_;
  std::uint64_t state = v.state.load(std::memory_order_seq_cst);
  const std::size_t from = claimed_of(state);
  const std::size_t to = committed_of(state);
  if (from < to) {
    // Say what this thread writes before taking the range: a crash flush interrupting it in
    // between finds the range either still free (and writes it) or taken and described here.
    v.writer_done.store(from, std::memory_order_relaxed);
    v.writer_end.store(to, std::memory_order_relaxed);
    v.writer.store(current_thread(), std::memory_order_seq_cst);
    if (!v.state.compare_exchange_strong(state, pack_state(to, to), std::memory_order_seq_cst)) {
      // A crash flush on another thread took it and writes it (the process is going down); the
      // buffer is kept as it is.
      v.writer.store(0, std::memory_order_seq_cst);
      return true;
    }
    const detail::recorder_write_function write_fn = g_write.load(std::memory_order_relaxed);
    std::size_t pos = from;
    while (pos < to) {
      const ssize_t w = write_fn != nullptr ? write_fn(v.fd, buffer_.get() + pos, to - pos)
                                            : ::write(v.fd, buffer_.get() + pos, to - pos);
      if (w < 0) {
        if (errno == EINTR) {
          continue;
        }
        v.writer.store(0, std::memory_order_seq_cst);
        fail("cannot write", errno);
        return false;
      }
      pos += static_cast<std::size_t>(w);
      // How far it got: a crash flush on this thread, before the loop ends, writes only the rest.
      v.writer_done.store(pos, std::memory_order_relaxed);
    }
    v.writer.store(0, std::memory_order_seq_cst);
  }
  // Everything is written: start the buffer again, unless a crash flush has begun (it may be
  // writing from the buffer on another thread; the lines that still fit go after these).
  if (!g_crashing.load(std::memory_order_seq_cst)) {
    v.state.store(0, std::memory_order_seq_cst);
  }
  return true;
}

hooks::event_filter recorder::interests() const noexcept {
  return options_.all_phases ? recorded_all : recorded_usual;
}

void recorder::on_event(const hooks::event& e) noexcept {
  if (failed_.load(std::memory_order_relaxed) || !wanted(e, options_.all_phases)) {
    return;
  }
  char line[max_line_bytes];
  const std::size_t n = format_line(e, line, sizeof line);
  if (n == 0) {
    return;
  }
  std::lock_guard lock(mutex_);
  if (failed_.load(std::memory_order_relaxed)) {
    return;
  }
  std::size_t used = committed_of(view_->state.load(std::memory_order_relaxed));
  if (used + n > capacity_) {
    if (!write_buffer_locked()) {
      return;
    }
    used = committed_of(view_->state.load(std::memory_order_relaxed));
    if (used + n > capacity_) {
      return;  // a crash flush keeps the buffer: no room left for this line
    }
  }
  std::memcpy(buffer_.get() + used, line, n);
  // Adds to the low half only (used + n <= capacity_ < 2^32); the release publishes the line.
  view_->state.fetch_add(n, std::memory_order_release);
  lines_.fetch_add(1, std::memory_order_relaxed);
  if (write_through_) [[unlikely]] {
    (void)write_buffer_locked();
  }
}

bool recorder::flush() noexcept {
  std::lock_guard lock(mutex_);
  if (failed_.load(std::memory_order_relaxed)) {
    return false;
  }
  return write_buffer_locked();
}

bool recorder::flush_and_write_through() noexcept {
  std::lock_guard lock(mutex_);
  write_through_ = true;
  if (failed_.load(std::memory_order_relaxed)) {
    return false;
  }
  return write_buffer_locked();
}

}  // namespace poolscope::profiler
