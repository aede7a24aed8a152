// The Python seam: see detail/python_seam.hpp for the contract.
#include "detail/python_seam.hpp"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "poolscope/spin_lock.hpp"

namespace poolscope::profiler::detail::python {

namespace {

// The C API, as opaque pointers: no Python header is included.
using object = void;
struct api {
  int (*is_initialized)() = nullptr;
  int (*is_finalizing)() = nullptr;  // absent in some versions: then never finalizing
  int (*gil_check)() = nullptr;
  object* (*this_thread_state)() = nullptr;  // PyGILState_GetThisThreadState
  int (*gil_ensure)() = nullptr;             // PyGILState_STATE is an int-sized enum
  void (*gil_release)(int) = nullptr;
  object* (*get_frame)() = nullptr;          // borrowed
  object* (*frame_back)(object*) = nullptr;  // new reference
  object* (*frame_code)(object*) = nullptr;  // new reference
  int (*frame_line)(object*) = nullptr;
  int (*frame_lasti)(object*) = nullptr;        // 3.11 on; without it every line is computed
  int (*code_line)(object*, int) = nullptr;     // PyCode_Addr2Line(code, byte offset)
  object* (*current_thread_state)() = nullptr;  // with the GIL held; null without it
  const unsigned long* version = nullptr;       // Py_Version (3.11 on)
  const object* code_type = nullptr;            // &PyCode_Type
  const object* frame_type = nullptr;           // &PyFrame_Type
  void (*incref)(object*) = nullptr;
  void (*decref)(object*) = nullptr;
  object* (*get_attr)(object*, const char*) = nullptr;  // new reference
  const char* (*utf8)(object*) = nullptr;
  void (*err_clear)() = nullptr;
  std::uintptr_t lo[4] = {};  // executable segments of the interpreter's object
  std::uintptr_t hi[4] = {};
  std::size_t ranges = 0;
  bool ok = false;
};

template <class F>
bool find(F& f, const char* name) noexcept {
  f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  return f != nullptr;
}

struct range_probe {
  std::uintptr_t address;
  api* a;
};

int find_interpreter_ranges(dl_phdr_info* info, std::size_t /*size*/, void* data) noexcept {
  auto* p = static_cast<range_probe*>(data);
  bool holds = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X) != 0 && p->address >= lo &&
        p->address < lo + ph.p_memsz) {
      holds = true;
    }
  }
  if (!holds) {
    return 0;
  }
  for (int i = 0; i < info->dlpi_phnum && p->a->ranges < std::size(p->a->lo); ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X) != 0) {
      p->a->lo[p->a->ranges] = info->dlpi_addr + ph.p_vaddr;
      p->a->hi[p->a->ranges] = info->dlpi_addr + ph.p_vaddr + ph.p_memsz;
      ++p->a->ranges;
    }
  }
  return 1;
}

const api& the_api() noexcept {
  static const api a = [] {
    api r;
    r.ok = find(r.is_initialized, "Py_IsInitialized") && find(r.gil_check, "PyGILState_Check") &&
           find(r.get_frame, "PyEval_GetFrame") && find(r.frame_back, "PyFrame_GetBack") &&
           find(r.frame_code, "PyFrame_GetCode") && find(r.frame_line, "PyFrame_GetLineNumber") &&
           find(r.incref, "Py_IncRef") && find(r.decref, "Py_DecRef") &&
           find(r.get_attr, "PyObject_GetAttrString") && find(r.utf8, "PyUnicode_AsUTF8") &&
           find(r.err_clear, "PyErr_Clear") &&
           find(r.this_thread_state, "PyGILState_GetThisThreadState") &&
           find(r.gil_ensure, "PyGILState_Ensure") && find(r.gil_release, "PyGILState_Release");
    (void)find(r.frame_lasti, "PyFrame_GetLasti");
    (void)find(r.code_line, "PyCode_Addr2Line");
    if (!find(r.current_thread_state, "PyThreadState_GetUnchecked")) {
      (void)find(r.current_thread_state, "_PyThreadState_UncheckedGet");
    }
    r.version = static_cast<const unsigned long*>(dlsym(RTLD_DEFAULT, "Py_Version"));
    r.code_type = dlsym(RTLD_DEFAULT, "PyCode_Type");
    r.frame_type = dlsym(RTLD_DEFAULT, "PyFrame_Type");
    if (!find(r.is_finalizing, "Py_IsFinalizing")) {
      (void)find(r.is_finalizing, "_Py_IsFinalizing");
    }
    if (r.ok) {
      range_probe p{reinterpret_cast<std::uintptr_t>(r.get_frame), &r};
      dl_iterate_phdr(&find_interpreter_ranges, &p);
    }
    return r;
  }();
  return a;
}

/// One code object: its names, copied when it was first seen (the object is kept alive).
struct code_info {
  std::string function;
  std::string file;
};

/// Code object -> id (1-based; 0: unknown). Guarded by its spin lock; its callers hold the GIL
/// too, so the lock is uncontended but for a free-threaded interpreter.
struct code_table {
  spin_lock lock;
  std::unordered_map<const object*, std::uint32_t> ids;
  std::vector<code_info> infos{code_info{"<python>", ""}};
};
code_table* table() noexcept {
  static auto* t = new (std::nothrow) code_table;  // leaked: frames may be captured at exit
  return t;
}

std::string attr_text(const api& a, object* o, const char* name) {
  object* v = a.get_attr(o, name);
  if (v == nullptr) {
    a.err_clear();
    return {};
  }
  const char* s = a.utf8(v);
  std::string out = s != nullptr ? std::string(s) : std::string();
  if (s == nullptr) {
    a.err_clear();
  }
  a.decref(v);
  return out;
}

// With the GIL held: the id of `code`, interned (and kept alive) on first sight.
std::uint32_t code_id(const api& a, object* code) noexcept {
  code_table* tp = table();
  if (tp == nullptr) {
    return 0;
  }
  code_table& t = *tp;
  {
    std::lock_guard lock(t.lock);
    if (auto it = t.ids.find(code); it != t.ids.end()) {
      return it->second;
    }
    if (t.infos.size() > max_code_objects) {
      return 0;
    }
  }
  try {
    code_info info{attr_text(a, code, "co_name"), attr_text(a, code, "co_filename")};
    std::lock_guard lock(t.lock);
    const auto id = static_cast<std::uint32_t>(t.infos.size());
    t.infos.push_back(std::move(info));
    t.ids.emplace(code, id);
    a.incref(code);  // an id never names another object
    return id;
  } catch (...) {
    return 0;
  }
}

constexpr int line_bits = 24;

}  // namespace

bool available() noexcept {
  return the_api().ok;
}

const stop_ranges& interpreter_code() noexcept {
  static const stop_ranges r = [] {
    const api& a = the_api();
    stop_ranges out;
    for (std::size_t i = 0; i < a.ranges && out.count < stop_ranges::max; ++i) {
      out.lo[out.count] = a.lo[i];
      out.hi[out.count] = a.hi[i];
      ++out.count;
    }
    return out;
  }();
  return r;
}

namespace {

/// A thread's frame words by (code object, instruction offset), for the C API walk: a frame seen
/// before (the outer frames of a loop) is one lookup, not a line-table search and a table lookup
/// under a lock. Only interned (kept-alive) code objects are cached, so a key never names another
/// object.
struct word_cache {
  static constexpr std::size_t size = 1024;
  struct entry {
    const object* code = nullptr;
    int lasti = -1;
    std::uintptr_t word = 0;
  };
  entry entries[size];
  static std::size_t slot(const object* code, int lasti) noexcept {
    // Both halves mixed into the top bits: the offsets of one code object differ by a few bytes.
    const auto h = (reinterpret_cast<std::uintptr_t>(code) ^
                    (static_cast<std::uintptr_t>(lasti) * 0xD6E8FEB86659FD93ULL)) *
                   0x9E3779B97F4A7C15ULL;
    return static_cast<std::size_t>(h >> 54) & (size - 1);
  }
};
thread_local word_cache t_words;

std::uintptr_t word_of(std::uint32_t id, int line) noexcept {
  const auto l = static_cast<std::uintptr_t>(line > 0 && line < (1 << line_bits) ? line : 0);
  return python_flag | (static_cast<std::uintptr_t>(id) << line_bits) | l;
}

// With the GIL held: the word of one frame whose code object is `code`.
std::uintptr_t frame_word(const api& a, object* frame, object* code) noexcept {
  if (a.frame_lasti == nullptr) {
    return word_of(code_id(a, code), a.frame_line(frame));
  }
  const int lasti = a.frame_lasti(frame);
  word_cache::entry& e = t_words.entries[word_cache::slot(code, lasti)];
  if (e.code == code && e.lasti == lasti) {
    return e.word;
  }
  const std::uint32_t id = code_id(a, code);
  const std::uintptr_t word = word_of(id, a.frame_line(frame));
  if (id != 0) {
    e = {code, lasti, word};
  }
  return word;
}

// With the GIL held: the thread's frames through the C API, innermost first.
std::size_t api_walk(const api& a, std::uintptr_t* out, std::size_t capacity, bool& truncated) {
  object* frame = a.get_frame();
  if (frame == nullptr) {
    return 0;
  }
  a.incref(frame);
  std::size_t n = 0;
  while (frame != nullptr && n < capacity) {
    object* code = a.frame_code(frame);
    if (code != nullptr) {
      out[n++] = frame_word(a, frame, code);
      a.decref(code);
    } else {
      out[n++] = word_of(0, 0);
    }
    object* back = a.frame_back(frame);
    a.decref(frame);
    frame = back;
  }
  if (frame != nullptr) {
    truncated = true;
    a.decref(frame);
  }
  return n;
}

// ---- reading the interpreter's frames directly ---------------------------------------------
//
// From 3.11 on, CPython keeps a thread's frames as a linked list of _PyInterpreterFrame structs
// that its thread state points to; the C API walk turns each into a frame object and takes two
// references per frame. direct_reader reads the list itself: per frame a few loads and a cache
// lookup, no call, no reference, and no GIL (the list of the calling thread changes only when
// that thread runs Python, and it is here instead; the code objects are held by their frames).
// The GIL is taken only to intern a code object or place met for the first time.
//
// The layouts come from CPython's headers of each version (Include/internal/pycore_frame.h,
// Include/cpython/pystate.h and code.h) and are trusted only after a check against the C API on
// this interpreter: the first captures made with the GIL held walk both ways and compare every
// frame (its struct's address, code object, instruction offset and line). A mismatch (another
// build of CPython, a debug or free-threaded build) turns the reader off for good.

/// Byte offsets of what the walk reads, for one minor version.
struct frame_layout {
  unsigned minor;
  std::size_t tstate_frame;     // thread state -> its _PyCFrame (3.11, 3.12) or top frame (3.13)
  std::ptrdiff_t cframe_top;    // _PyCFrame -> top frame; -1: the thread state points at it
  std::size_t code;             // frame -> code object (f_code; f_executable in 3.13)
  std::size_t previous;         // frame -> the frame below
  std::size_t instr;            // frame -> instruction pointer (prev_instr; instr_ptr in 3.13)
  std::size_t owner;            // frame -> owner (char)
  std::size_t code_start;       // code object -> its instructions (co_code_adaptive)
  std::size_t first_traceable;  // code object -> _co_firsttraceable (int, in code units)
  bool shim_frames;             // frames owned by the C stack (3.12 on) are the evaluator's own
};
constexpr frame_layout layouts[] = {
    {11, 56, 8, 32, 48, 56, 69, 184, 168, false},
    {12, 56, 0, 0, 8, 56, 70, 192, 176, true},
    {13, 72, -1, 0, 8, 56, 70, 200, 184, true},
};
constexpr char owned_by_generator = 1;
constexpr char owned_by_c_stack = 3;
constexpr std::size_t object_type = 8;         // PyObject -> ob_type
constexpr std::size_t frame_object_data = 24;  // PyFrameObject -> f_frame (3.11 to 3.13)
constexpr std::size_t code_unit = 2;

template <class T>
T load(const void* base, std::size_t offset) noexcept {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + offset, sizeof v);
  return v;
}

/// One frame as the direct reader sees it.
struct raw_frame {
  const void* frame;
  object* code;
  std::uintptr_t instr;
};

/// A thread's frame words by instruction address, for the direct reader. An instruction lies
/// inside its code object, so its address names one place of one code object; only places of
/// interned (kept-alive) code objects are cached, so no other object can be at that address, and
/// a frame whose instruction is cached needs neither its code object read nor its checks made.
struct place_cache {
  static constexpr std::size_t size = 2048;
  struct entry {
    std::uintptr_t instr = 0;
    std::uintptr_t word = 0;
  };
  entry entries[size];
  entry& find(std::uintptr_t instr) noexcept {
    return entries[(instr * 0x9E3779B97F4A7C15ULL) >> 53 & (size - 1)];
  }
};
thread_local place_cache t_places;

class direct_reader {
 public:
  /// The layout of the running interpreter, or null (a version without one).
  static const frame_layout* layout_of(const api& a) noexcept {
    if (a.version == nullptr || a.code_type == nullptr || a.frame_type == nullptr ||
        a.code_line == nullptr || a.frame_lasti == nullptr || a.current_thread_state == nullptr) {
      return nullptr;
    }
    const unsigned long v = *a.version;
    if ((v >> 24) != 3) {
      return nullptr;
    }
    for (const frame_layout& l : layouts) {
      if (((v >> 16) & 0xff) == l.minor) {
        return &l;
      }
    }
    return nullptr;
  }

  explicit direct_reader(const frame_layout& l, const api& a) noexcept : l_(l), a_(a) {}

  /// The innermost frame of `tstate` (null: no Python frame).
  [[nodiscard]] const void* top(const void* tstate) const noexcept {
    const void* p = load<const void*>(tstate, l_.tstate_frame);
    if (l_.cframe_top < 0 || p == nullptr) {
      return p;
    }
    return load<const void*>(p, static_cast<std::size_t>(l_.cframe_top));
  }
  [[nodiscard]] const void* previous(const void* frame) const noexcept {
    return load<const void*>(frame, l_.previous);
  }
  [[nodiscard]] const frame_layout& layout() const noexcept { return l_; }
  /// The frame's code object and instruction, or false for a frame the C API skips (the
  /// evaluator's shim frames, frames that have not started).
  bool read(const void* frame, raw_frame& out) const noexcept {
    const char owner = load<char>(frame, l_.owner);
    if (l_.shim_frames && owner == owned_by_c_stack) {
      return false;
    }
    auto* code = load<object*>(frame, l_.code);
    if (code == nullptr || load<const void*>(code, object_type) != a_.code_type) {
      return false;
    }
    const auto instr = load<std::uintptr_t>(frame, l_.instr);
    const std::uintptr_t start = reinterpret_cast<std::uintptr_t>(code) + l_.code_start;
    if (owner != owned_by_generator) {
      const auto first = static_cast<std::uintptr_t>(load<int>(code, l_.first_traceable));
      if (instr < start + first * code_unit) {
        return false;
      }
    } else if (instr < start) {
      return false;
    }
    out = {frame, code, instr};
    return true;
  }
  /// The byte offset of the frame's instruction (PyFrame_GetLasti's value).
  [[nodiscard]] int offset(const raw_frame& f) const noexcept {
    return static_cast<int>(f.instr - reinterpret_cast<std::uintptr_t>(f.code) - l_.code_start);
  }

 private:
  const frame_layout& l_;
  const api& a_;
};

/// The direct reader's state: 0 until checked, 1 on, -1 off for good.
std::atomic<int> direct_state{0};
std::atomic<int> direct_checks{0};
constexpr int checks_needed = 4;  // captures that must agree with the C API

const frame_layout* direct_layout() noexcept {
  static const frame_layout* const l = direct_reader::layout_of(the_api());
  return l;
}

// With the GIL held: true if the direct reader sees exactly the frames the C API gives.
bool agrees_with_api(const api& a, const direct_reader& r, const void* tstate) noexcept {
  object* frame = a.get_frame();
  const void* mine = r.top(tstate);
  if (frame == nullptr) {
    raw_frame f{};
    while (mine != nullptr && !r.read(mine, f)) {
      mine = r.previous(mine);
    }
    return mine == nullptr;
  }
  a.incref(frame);
  bool same = true;
  while (frame != nullptr && same) {
    // Only a frame the C API names is read: a wrong layout fails the comparison first.
    same = load<const void*>(frame, object_type) == a.frame_type;
    const void* theirs = same ? load<const void*>(frame, frame_object_data) : nullptr;
    raw_frame f{};
    while (same && mine != nullptr && mine != theirs && !r.read(mine, f)) {
      mine = r.previous(mine);
    }
    same = same && mine == theirs && r.read(mine, f);
    if (same) {
      object* code = a.frame_code(frame);
      same = code == f.code && a.frame_lasti(frame) == r.offset(f) &&
             a.frame_line(frame) == a.code_line(f.code, r.offset(f));
      if (code != nullptr) {
        a.decref(code);
      }
      mine = r.previous(mine);
    }
    object* back = a.frame_back(frame);
    a.decref(frame);
    frame = back;
  }
  if (frame != nullptr) {
    a.decref(frame);
    return false;
  }
  if (same) {
    // The C API has no more frames: neither may the reader.
    raw_frame f{};
    while (mine != nullptr && !r.read(mine, f)) {
      mine = r.previous(mine);
    }
    same = mine == nullptr;
  }
  return same;
}

// 3.11 and 3.12 reach the top frame through a _PyCFrame: the thread state's own (root_cframe)
// or one on the evaluator's C stack. Anything else means the layout is not this interpreter's,
// and is not followed.
bool plausible_cframe(const void* tstate, const void* cframe) noexcept {
  const auto p = reinterpret_cast<std::uintptr_t>(cframe);
  const auto t = reinterpret_cast<std::uintptr_t>(tstate);
  if (p == 0 || p % alignof(void*) != 0) {
    return false;
  }
  return (p >= t && p < t + 4096) || on_this_thread_stack(p, 2 * sizeof(void*));
}

// With the GIL held, while the direct reader is being checked: one more comparison.
void check_direct_reader(const api& a) noexcept {
  const frame_layout* l = direct_layout();
  if (l == nullptr) {
    direct_state.store(-1, std::memory_order_relaxed);
    return;
  }
  const void* tstate = a.current_thread_state();
  if (tstate == nullptr) {
    return;
  }
  if (l->cframe_top >= 0 && !plausible_cframe(tstate, load<const void*>(tstate, l->tstate_frame))) {
    direct_state.store(-1, std::memory_order_relaxed);
    return;
  }
  const direct_reader r(*l, a);
  if (!agrees_with_api(a, r, tstate)) {
    direct_state.store(-1, std::memory_order_relaxed);
    return;
  }
  if (direct_checks.fetch_add(1, std::memory_order_relaxed) + 1 >= checks_needed) {
    int expected = 0;
    direct_state.compare_exchange_strong(expected, 1, std::memory_order_relaxed);
  }
}

// With the GIL held: the words of the frames the cache did not know (out[i] == 0).
void resolve_missing(const api& a, const direct_reader& r, place_cache& cache,
                     const raw_frame* frames, std::uintptr_t* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    if (out[i] != 0) {
      continue;
    }
    const raw_frame& f = frames[i];
    const std::uint32_t id = code_id(a, f.code);
    out[i] = word_of(id, a.code_line(f.code, r.offset(f)));
    if (id != 0) {
      cache.find(f.instr) = {f.instr, out[i]};
    }
  }
}

// The words of the frames from `top` outwards, 0 for those not cached (their raw frames are in
// `frames` at the same index, and counted in `missing`). Apart from direct_walk, and opaque to
// interprocedural optimization, so that the cache is a plain pointer here: the compiler would
// otherwise look the thread-local up again for each frame (a call, in a shared library).
__attribute__((noipa)) std::size_t read_frames(const direct_reader& r, place_cache& cache,
                                               const void* top, std::uintptr_t* out,
                                               raw_frame* frames, std::size_t capacity,
                                               std::size_t& missing, bool& truncated) noexcept {
  // The offsets in registers: the stores to `out` could otherwise alias the layout's fields.
  const std::size_t instr_at = r.layout().instr;
  const std::size_t previous_at = r.layout().previous;
  std::size_t n = 0;
  for (const void* p = top; p != nullptr; p = load<const void*>(p, previous_at)) {
    const auto instr = load<std::uintptr_t>(p, instr_at);
    const place_cache::entry& e = cache.find(instr);
    std::uintptr_t word = e.word;
    if (e.instr != instr) [[unlikely]] {
      raw_frame f;
      if (!r.read(p, f)) {
        continue;
      }
      if (n < capacity) {
        frames[n] = f;
        ++missing;
        word = 0;
      }
    }
    if (n == capacity) {
      truncated = true;
      break;
    }
    out[n++] = word;
  }
  return n;
}

// The calling thread's frames read directly; the GIL is taken only for frames not cached.
std::size_t direct_walk(const api& a, std::uintptr_t* out, std::size_t capacity, bool& truncated,
                        bool holds_gil, bool may_take_gil) noexcept {
  const void* tstate = holds_gil ? a.current_thread_state() : a.this_thread_state();
  if (tstate == nullptr) {
    return 0;  // a thread that never ran Python
  }
  const direct_reader r(*direct_layout(), a);
  place_cache& cache = t_places;
  raw_frame frames[256];  // the frames not cached, at their index
  std::size_t missing = 0;
  const std::size_t n = read_frames(r, cache, r.top(tstate), out, frames,
                                    std::min(capacity, std::size(frames)), missing, truncated);
  if (missing == 0) {
    return n;
  }
  if (holds_gil) {
    resolve_missing(a, r, cache, frames, out, n);
    return n;
  }
  if (!may_take_gil) {
    truncated = false;
    return 0;
  }
  const int state = a.gil_ensure();
  resolve_missing(a, r, cache, frames, out, n);
  a.gil_release(state);
  return n;
}

}  // namespace

std::size_t capture(std::uintptr_t* out, std::size_t capacity, bool& truncated,
                    bool may_take_gil) noexcept {
  truncated = false;
  const api& a = the_api();
  if (!a.ok || capacity == 0 || a.is_initialized() == 0 ||
      (a.is_finalizing != nullptr && a.is_finalizing() != 0)) {
    return 0;
  }
  const bool holds_gil = a.gil_check() != 0;
  const int direct = direct_state.load(std::memory_order_relaxed);
  if (direct > 0) {
    return direct_walk(a, out, capacity, truncated, holds_gil, may_take_gil);
  }
  // A Python thread that released the GIL around a call into C (PyTorch's operators, ctypes):
  // its frames are read with the GIL taken for the walk. A thread that never ran Python has no
  // thread state and no frames: it is not made one.
  if (!holds_gil && (!may_take_gil || a.this_thread_state() == nullptr)) {
    return 0;
  }
  const int state = holds_gil ? 0 : a.gil_ensure();
  if (direct == 0) {
    check_direct_reader(a);
  }
  const std::size_t n = api_walk(a, out, capacity, truncated);
  if (!holds_gil) {
    a.gil_release(state);
  }
  return n;
}

bool direct_reads() noexcept {
  return direct_state.load(std::memory_order_relaxed) > 0;
}

bool resolve(std::uintptr_t word, std::string& function, std::string& file, int& line) {
  if (!is_python_frame(word)) {
    return false;
  }
  const auto id = static_cast<std::uint32_t>((word & ~python_flag) >> line_bits);
  line = static_cast<int>(word & ((std::uintptr_t{1} << line_bits) - 1));
  code_table* t = table();
  if (t == nullptr) {
    function = "<python>";
    file.clear();
    return true;
  }
  std::lock_guard lock(t->lock);
  const code_info& info = id < t->infos.size() ? t->infos[id] : t->infos[0];
  function = info.function;
  file = info.file;
  return true;
}

}  // namespace poolscope::profiler::detail::python
