// A Python process's line profile with its interpreter frames collapsed (interpreter_frames.hpp).
#include "poolscope/analysis/interpreter_frames.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "detail/profile_tree.hpp"

namespace poolscope::analysis {

using profiler::profile_node;

namespace {

std::string_view file_name(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// "python3.12", "libpython3.12.so.1.0": the name, then nothing, a digit or a '.'.
bool named(std::string_view file, std::string_view name) {
  return file.starts_with(name) &&
         (file.size() == name.size() || (file[name.size()] >= '0' && file[name.size()] <= '9') ||
          file[name.size()] == '.');
}

bool interpreter_module(std::string_view module) {
  const std::string_view name = file_name(module);
  return named(name, "libpython") || named(name, "python") || named(name, "libffi") ||
         name.starts_with("_ctypes.");
}

bool interpreter_function(std::string_view f) {
  if (f.find_first_of(":<(") != std::string_view::npos) {
    return false;  // a C++ name
  }
  if (f.size() > 2 && f.starts_with("Py") && ((f[2] >= 'A' && f[2] <= 'Z') || f[2] == '_')) {
    return true;
  }
  constexpr std::array<std::string_view, 10> prefixes{
      "_Py",          "cfunction_",        "method_vectorcall", "vectorcall_", "slot_tp_",
      "wrapper_call", "wrapperdescr_call", "pymain_",           "ffi_call",    "_ctypes_"};
  return std::any_of(prefixes.begin(), prefixes.end(),
                     [&](std::string_view p) { return f.starts_with(p); });
}

// The C library's process start, between the interpreter executable's `_start` and its `main`:
// inside a run, part of it.
bool process_start(const profile_node& n) {
  return named(file_name(n.module), "libc.so") &&
         (n.function == "__libc_start_main" || n.function == "__libc_start_call_main");
}

// One run being gathered: its frames' own figures, the call sites past it (merged), and the
// shortest and longest path through it.
struct run {
  profile_node past;  // children: the call sites past the run
  profiler::profile_counts self;
  std::size_t frames = 0;
  std::size_t shortest = 0;
  std::size_t longest = 0;
};

void gather(const profile_node& n, std::size_t depth, run& r) {
  r.self += n.self;
  ++r.frames;
  bool ends_here = n.children.empty();
  for (const profile_node& c : n.children) {
    if (is_interpreter_frame(c) || process_start(c)) {
      gather(c, depth + 1, r);
    } else {
      ends_here = true;
      profile_node one;
      one.children.push_back(c);
      detail::add_node(r.past, one);
    }
  }
  if (ends_here || n.self.count != 0 || n.self.acquire_count != 0) {
    r.shortest = r.shortest == 0 ? depth : std::min(r.shortest, depth);
    r.longest = std::max(r.longest, depth);
  }
}

std::string run_label(const run& r) {
  std::string count = std::to_string(r.shortest);
  if (r.longest != r.shortest) {
    count += "-" + std::to_string(r.longest);
  }
  return "... " + count + " interpreter frame" + (r.longest == 1 ? "" : "s");
}

// `n`'s children with their interpreter runs collapsed, recursively.
void collapse_children(profile_node& n, collapsed_profile& out) {
  std::vector<profile_node> kept;
  run r;
  for (profile_node& c : n.children) {
    if (is_interpreter_frame(c)) {
      gather(c, 1, r);
    } else {
      kept.push_back(std::move(c));
    }
  }
  if (r.frames != 0) {
    profile_node folded;
    folded.function = run_label(r);
    folded.self = r.self;
    folded.children = std::move(r.past.children);
    ++out.runs;
    out.frames += r.frames;
    kept.push_back(std::move(folded));
  }
  n.children = std::move(kept);
  for (profile_node& c : n.children) {
    collapse_children(c, out);
  }
}

}  // namespace

bool is_interpreter_frame(const profile_node& n) {
  return !n.module.empty() && (interpreter_module(n.module) || interpreter_function(n.function));
}

collapsed_profile collapse_interpreter_frames(const profiler::line_profile& p) {
  collapsed_profile out;
  out.profile = p;
  collapse_children(out.profile.root, out);
  if (out.runs != 0) {
    out.profile.recompute_totals();
  }
  return out;
}

}  // namespace poolscope::analysis
