#include "poolscope/profiler/recorder.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include "detail/drain_thread.hpp"
#include "detail/event_ring.hpp"
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

namespace detail {

/// Allocator names as the recorder writes them (escaped JSON string bodies), by allocator id:
/// filled by the recording threads the first time they see an id, read by the writer thread and
/// by the fatal-signal handler (atomics only). Ids past the table's room are written "?".
struct recorder_names {
  static constexpr std::size_t slots = 4096;
  std::atomic<std::uint32_t> id[slots] = {};  // 0: empty
  std::atomic<const char*> name[slots] = {};  // set after id, then never changed
  ~recorder_names() {
    for (auto& n : name) {
      delete[] n.load(std::memory_order_relaxed);
    }
  }
};

/// One event as a line says it (recorder.hpp declares it for recorder::append_line_locked).
struct recorder_line {
  std::uint64_t seq = 0;
  std::uint64_t time_ns = 0;
  std::uint64_t thread = 0;
  std::uint64_t stream = 0;
  std::uint64_t ptr = 0;
  std::uint64_t requested = 0;
  std::uint64_t rounded = 0;
  std::int32_t device = -1;
  std::uint32_t allocator_id = 0;
  hooks::event_kind kind = hooks::event_kind::pool_malloc;
  hooks::event_phase phase = hooks::event_phase::post;
};

}  // namespace detail

namespace {

using line_fields = detail::recorder_line;

line_fields fields_of(const hooks::event& e) noexcept {
  line_fields f;
  f.seq = e.seq;
  f.time_ns = e.time_ns;
  f.thread = e.thread;
  f.stream = reinterpret_cast<std::uintptr_t>(e.stream);
  f.ptr = reinterpret_cast<std::uintptr_t>(e.ptr);
  f.requested = e.requested;
  f.rounded = e.rounded;
  f.device = e.device;
  f.allocator_id = e.allocator_id;
  f.kind = e.kind;
  f.phase = e.phase;
  return f;
}

/// One event in the ring: its line_fields in 60 bytes, so that the record and its slot's
/// sequence number are one cache line (event_ring). The thread id takes 32 bits (a Linux thread
/// id is a pid_t) and the device 16 (CUDA ordinals, -1 for the host); an event whose values do
/// not fit goes around the ring (recorder::on_event).
struct packed_record {
  std::uint64_t seq;
  std::uint64_t time_ns;
  std::uint64_t stream;
  std::uint64_t ptr;
  std::uint64_t requested;
  std::uint64_t rounded;
  std::uint32_t thread;
  std::uint32_t allocator_id;
  std::int16_t device;
  hooks::event_kind kind;
  hooks::event_phase phase;
};
/// The bytes of a packed_record the ring holds: its members, not its tail padding.
constexpr std::size_t packed_bytes = offsetof(packed_record, phase) + sizeof(hooks::event_phase);
static_assert(packed_bytes <= detail::event_ring::max_one_line_record);

/// The fields of `from` as a To (line_fields and packed_record each way; narrowing only where
/// the caller checked fits()).
template <class To, class From>
To convert(const From& from) noexcept {
  To to;
  to.seq = from.seq;
  to.time_ns = from.time_ns;
  to.thread = static_cast<decltype(to.thread)>(from.thread);
  to.stream = from.stream;
  to.ptr = from.ptr;
  to.requested = from.requested;
  to.rounded = from.rounded;
  to.device = static_cast<decltype(to.device)>(from.device);
  to.allocator_id = from.allocator_id;
  to.kind = from.kind;
  to.phase = from.phase;
  return to;
}

/// Whether a packed_record holds `f`'s values.
bool fits(const line_fields& f) noexcept {
  return f.thread <= UINT32_MAX && f.device >= INT16_MIN && f.device <= INT16_MAX;
}

/// The record in a ring slot. Async-signal-safe.
line_fields unpack(const void* slot) noexcept {
  packed_record r;
  std::memcpy(&r, slot, packed_bytes);
  return convert<line_fields>(r);
}

constexpr std::size_t min_buffer_bytes = 4096;
constexpr std::size_t max_buffer_bytes = std::size_t{1} << 30;  // offsets fit in 32 bits
constexpr std::size_t max_line_bytes = 1024;

// ---- line formatting -------------------------------------------------------------------------

/// JSON string body of an allocator name: escaped, ASCII only, at most 128 bytes of the name.
void escape_name(const char* name, char* out, std::size_t cap) noexcept {
  static constexpr char hex[] = "0123456789abcdef";
  std::size_t n = 0;
  std::size_t taken = 0;
  for (const char* p = name != nullptr ? name : ""; *p != '\0' && n + 7 < cap && taken < 128;
       ++p, ++taken) {
    const auto c = static_cast<unsigned char>(*p);
    if (c == '"' || c == '\\') {
      out[n++] = '\\';
      out[n++] = static_cast<char>(c);
    } else if (c < 0x20) {
      const char esc[] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
      for (char e : esc) {
        out[n++] = e;
      }
    } else if (c >= 0x80) {
      out[n++] = '?';  // keep every line valid UTF-8 whatever the name holds
    } else {
      out[n++] = static_cast<char>(c);
    }
  }
  out[n] = '\0';
}

/// The escaped name of `e`'s allocator, interned the first time its id is seen. Never fails:
/// an id the table has no room for (or no memory for its name) is written "?".
void intern_name(detail::recorder_names& t, const hooks::event& e) noexcept {
  const std::uint32_t id = e.allocator_id;
  for (std::size_t k = 0; k < detail::recorder_names::slots; ++k) {
    const std::size_t i = (id * 0x9E3779B1U + k) % detail::recorder_names::slots;
    std::uint32_t seen = t.id[i].load(std::memory_order_acquire);
    if (seen == 0 && t.id[i].compare_exchange_strong(seen, id, std::memory_order_acq_rel)) {
      char buf[160];
      escape_name(e.allocator_name, buf, sizeof buf);
      const std::size_t len = std::strlen(buf);
      char* copy = new (std::nothrow) char[len + 1];
      if (copy != nullptr) {
        std::memcpy(copy, buf, len + 1);
      }
      t.name[i].store(copy != nullptr ? copy : "?", std::memory_order_release);
      return;
    }
    if (seen == id) {
      // Another thread may be storing the name right now: its store comes soon.
      while (t.name[i].load(std::memory_order_acquire) == nullptr) {
      }
      return;
    }
  }
}

/// The name interned for `id`, or "?". Async-signal-safe.
const char* name_of(const detail::recorder_names& t, std::uint32_t id) noexcept {
  for (std::size_t k = 0; k < detail::recorder_names::slots; ++k) {
    const std::size_t i = (id * 0x9E3779B1U + k) % detail::recorder_names::slots;
    const std::uint32_t seen = t.id[i].load(std::memory_order_acquire);
    if (seen == id) {
      const char* n = t.name[i].load(std::memory_order_acquire);
      return n != nullptr ? n : "?";
    }
    if (seen == 0) {
      break;
    }
  }
  return "?";
}

// Line text, written with std::to_chars (no locale, no allocation: async-signal-safe) into a
// buffer the caller has checked is long enough.
char* put(char* p, std::string_view s) noexcept {
  std::memcpy(p, s.data(), s.size());
  return p + s.size();
}
char* dec(char* p, std::uint64_t v) noexcept {
  return std::to_chars(p, p + 20, v).ptr;
}
char* sdec(char* p, std::int64_t v) noexcept {
  return std::to_chars(p, p + 20, v).ptr;
}
char* hex(char* p, std::uint64_t v) noexcept {
  p = put(p, "0x");
  return std::to_chars(p, p + 16, v, 16).ptr;
}

/// The most bytes of a line beside its allocator name: its fixed text, seven numbers of at most
/// 20 characters, two hex numbers of at most 18, the longest action and phase.
constexpr std::size_t max_line_bytes_beside_name =
    std::string_view(
        "{\"seq\":,\"time_ns\":,\"thread\":,\"device\":,\"stream\":\"\","
        "\"allocator\":\"\",\"allocator_id\":,\"action\":\"\",\"phase\":\"\","
        "\"ptr\":\"\",\"size\":,\"rounded\":}\n")
        .size() +
    7 * 20 + 2 * 18 + std::string_view("invalid_free").size() + std::string_view("instant").size();

/// One log line for `f`; returns its length (0 if it did not fit). Async-signal-safe.
std::size_t format_line(const line_fields& f, std::string_view name, char* out,
                        std::size_t cap) noexcept {
  if (cap < max_line_bytes_beside_name + name.size()) {
    return 0;
  }
  char* p = put(out, "{\"seq\":");
  p = put(dec(p, f.seq), ",\"time_ns\":");
  p = put(dec(p, f.time_ns), ",\"thread\":");
  p = put(dec(p, f.thread), ",\"device\":");
  p = put(sdec(p, f.device), ",\"stream\":\"");
  p = put(hex(p, f.stream), "\",\"allocator\":\"");
  p = put(put(p, name), "\",\"allocator_id\":");
  p = put(dec(p, f.allocator_id), ",\"action\":\"");
  p = put(put(p, action_name(f.kind)), "\",\"phase\":\"");
  p = put(put(p, hooks::to_string(f.phase)), "\",\"ptr\":\"");
  p = put(hex(p, f.ptr), "\",\"size\":");
  p = put(dec(p, f.requested), ",\"rounded\":");
  p = put(dec(p, f.rounded), "}\n");
  return static_cast<std::size_t>(p - out);
}

/// The line saying `n` events were dropped. Async-signal-safe.
std::size_t format_dropped(std::uint64_t n, char* out, std::size_t cap) noexcept {
  if (cap < std::string_view("{\"dropped\":}\n").size() + 20) {
    return 0;
  }
  char* p = put(dec(put(out, "{\"dropped\":"), n), "}\n");
  return static_cast<std::size_t>(p - out);
}

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
    // Then what the writer thread has not formatted yet, in ring order.
    if (v->ring != nullptr && v->names != nullptr) {
      v->ring->peek([v](const void* record) {
        const line_fields f = unpack(record);
        char line[max_line_bytes];
        const std::size_t n = format_line(f, name_of(*v->names, f.allocator_id), line, sizeof line);
        write_all(v->fd, line, n);
      });
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
  names_ = std::make_unique<detail::recorder_names>();
  ring_ = std::make_unique<detail::event_ring>(options_.ring_slots, packed_bytes);
  view_->ring = ring_.get();
  view_->names = names_.get();
  if (options_.flush_on_fatal_signal) {
    install_handlers_once();
    slot_ = register_view(view_.get());
    if (slot_ < 0) {
      log(log_level::warn, "recorder: more than 32 recorders alive; '" + path +
                               "' will not be flushed on a fatal signal");
    }
  }
  if (options_.writer_thread) {
    writer_ = std::make_unique<detail::drain_thread>(
        [this] {
          std::lock_guard lock(mutex_);
          drain_locked();
        },
        std::chrono::milliseconds(5), "poolscope rec");
  }
}

recorder::~recorder() {
  if (writer_ != nullptr) {
    writer_->stop();
  }
  if (slot_ >= 0) {
    g_views[slot_].store(nullptr, std::memory_order_release);
  }
  {
    std::lock_guard lock(mutex_);
    drain_locked();
    if (!failed_.load(std::memory_order_relaxed)) {
      write_buffer_locked();
    }
  }
  ::close(view_->fd);
}

std::uint64_t recorder::dropped() const noexcept {
  return ring_->dropped();
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
  intern_name(*names_, e);
  const line_fields f = fields_of(e);
  if (write_through_.load(std::memory_order_acquire) || !fits(f)) [[unlikely]] {
    // The end of the program (the writer thread may be gone), or values the ring's record has
    // no room for: the line is formatted here, after what the ring holds.
    write_line(f);
    return;
  }
  const auto r = convert<packed_record>(f);
  const auto pushed = ring_->try_push([&r](void* slot) { std::memcpy(slot, &r, packed_bytes); });
  if (pushed != detail::event_ring::push_result::stored && writer_ != nullptr) {
    writer_->wake();
  }
}

void recorder::write_line(const detail::recorder_line& f) noexcept {
  std::lock_guard lock(mutex_);
  drain_locked();
  if (append_line_locked(f)) {
    lines_.fetch_add(1, std::memory_order_relaxed);
    if (write_through_.load(std::memory_order_acquire)) {
      (void)write_buffer_locked();
    }
  }
}

char* recorder::room_locked(std::size_t n) noexcept {
  if (failed_.load(std::memory_order_relaxed)) {
    return nullptr;
  }
  std::size_t used = committed_of(view_->state.load(std::memory_order_relaxed));
  if (used + n > capacity_) {
    if (!write_buffer_locked()) {
      return nullptr;
    }
    used = committed_of(view_->state.load(std::memory_order_relaxed));
    if (used + n > capacity_) {
      return nullptr;  // a crash flush keeps the buffer: no room left for this line
    }
  }
  return buffer_.get() + used;
}

void recorder::commit_locked(std::size_t n) noexcept {
  // Adds to the low half only (used + n <= capacity_ < 2^32); the release publishes the line.
  view_->state.fetch_add(n, std::memory_order_release);
}

bool recorder::append_line_locked(const detail::recorder_line& f) noexcept {
  const std::string_view name = name_of(*names_, f.allocator_id);
  const std::size_t most = max_line_bytes_beside_name + name.size();
  char* at = room_locked(most);
  if (at == nullptr) {
    return false;
  }
  commit_locked(format_line(f, name, at, most));
  return true;
}

void recorder::drain_locked() noexcept {
  std::uint64_t appended = 0;
  ring_->drain([&](const void* slot) {
    const line_fields f = unpack(slot);
    appended += append_line_locked(f) ? 1 : 0;
  });
  lines_.fetch_add(appended, std::memory_order_relaxed);  // once: hooks read this object's lines
  const std::uint64_t dropped = ring_->dropped();
  if (dropped != dropped_written_) {
    constexpr std::size_t most = 64;
    if (char* at = room_locked(most); at != nullptr) {
      commit_locked(format_dropped(dropped - dropped_written_, at, most));
      dropped_written_ = dropped;
    }
  }
}

bool recorder::flush() noexcept {
  std::lock_guard lock(mutex_);
  drain_locked();
  if (failed_.load(std::memory_order_relaxed)) {
    return false;
  }
  return write_buffer_locked();
}

bool recorder::flush_and_write_through() noexcept {
  std::lock_guard lock(mutex_);
  write_through_.store(true, std::memory_order_release);
  drain_locked();
  if (failed_.load(std::memory_order_relaxed)) {
    return false;
  }
  return write_buffer_locked();
}

}  // namespace poolscope::profiler
