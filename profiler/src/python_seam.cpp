// The Python seam: see detail/python_seam.hpp for the contract.
#include "detail/python_seam.hpp"

#include <dlfcn.h>
#include <link.h>

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
  int (*frame_lasti)(object*) = nullptr;  // 3.11 on; without it every line is computed
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

bool in_interpreter(std::uintptr_t return_address) noexcept {
  const api& a = the_api();
  for (std::size_t i = 0; i < a.ranges; ++i) {
    if (return_address >= a.lo[i] && return_address < a.hi[i]) {
      return true;
    }
  }
  return false;
}

namespace {

/// A thread's last frame words by (code object, instruction offset): a frame that has not moved
/// since the last walk (the outer frames of a loop) is one lookup, not a line-table search and a
/// table lookup under a lock. Only interned (kept-alive) code objects are cached, so a key never
/// names another object.
struct word_cache {
  static constexpr std::size_t size = 1024;
  struct entry {
    const object* code = nullptr;
    int lasti = -1;
    std::uintptr_t word = 0;
  };
  entry entries[size];
  static std::size_t slot(const object* code, int lasti) noexcept {
    const auto h = (reinterpret_cast<std::uintptr_t>(code) >> 4) * 0x9E3779B97F4A7C15ULL +
                   static_cast<std::uintptr_t>(lasti);
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

// With the GIL held: the thread's frames, innermost first.
std::size_t walk(const api& a, std::uintptr_t* out, std::size_t capacity, bool& truncated) {
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

}  // namespace

std::size_t capture(std::uintptr_t* out, std::size_t capacity, bool& truncated,
                    bool may_take_gil) noexcept {
  truncated = false;
  const api& a = the_api();
  if (!a.ok || capacity == 0 || a.is_initialized() == 0 ||
      (a.is_finalizing != nullptr && a.is_finalizing() != 0)) {
    return 0;
  }
  if (a.gil_check() != 0) {
    return walk(a, out, capacity, truncated);
  }
  // A Python thread that released the GIL around a call into C (PyTorch's operators, ctypes):
  // its frames are read with the GIL taken for the walk. A thread that never ran Python has no
  // thread state and no frames: it is not made one.
  if (!may_take_gil || a.this_thread_state() == nullptr) {
    return 0;
  }
  const int state = a.gil_ensure();
  const std::size_t n = walk(a, out, capacity, truncated);
  a.gil_release(state);
  return n;
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
