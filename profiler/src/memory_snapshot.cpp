#include "poolscope/profiler/memory_snapshot.hpp"

#include <array>
#include <map>
#include <tuple>

#include "detail/pickle_writer.hpp"
#include "poolscope/error.hpp"

namespace poolscope::profiler {

namespace {

constexpr std::array<std::string_view, trace_action_count> action_names = {
    "alloc",        "free_requested", "free_completed", "segment_alloc",
    "segment_free", "segment_map",    "segment_unmap",  "oom",
    "snapshot",
};
constexpr std::array<std::string_view, 3> state_names = {"active_allocated", "active_pending_free",
                                                         "inactive"};

/// Writes stacks once each: a distinct frame dict, then a distinct frame list, is pickled the
/// first time and fetched from the memo after that.
class stack_pickler {
 public:
  stack_pickler(detail::pickle_writer& w, const std::vector<std::vector<snapshot_frame>>& stacks)
      : w_(w), stacks_(stacks), memo_(stacks.size(), unwritten) {}

  void frames(std::uint32_t stack) {
    if (stack >= stacks_.size()) {
      throw logic_error("poolscope: memory_snapshot: stack index " + std::to_string(stack) +
                        " is out of range (" + std::to_string(stacks_.size()) + " stacks)");
    }
    if (memo_[stack] != unwritten) {
      w_.fetch(memo_[stack]);
      return;
    }
    w_.begin_list();
    for (const snapshot_frame& f : stacks_[stack]) {
      frame(f);
    }
    w_.end_list();
    memo_[stack] = w_.memoize();
  }

 private:
  static constexpr std::uint32_t unwritten = UINT32_MAX;

  void frame(const snapshot_frame& f) {
    const auto key = std::tie(f.name, f.filename, f.line);
    if (auto it = frames_.find(key); it != frames_.end()) {
      w_.fetch(it->second);
      return;
    }
    w_.begin_dict();
    w_.string("name");
    w_.string(f.name);
    w_.string("filename");
    w_.string(f.filename);
    w_.string("line");
    w_.integer(f.line);
    w_.end_dict();
    frames_.emplace(key, w_.memoize());
  }

  detail::pickle_writer& w_;
  const std::vector<std::vector<snapshot_frame>>& stacks_;
  std::vector<std::uint32_t> memo_;
  std::map<std::tuple<const std::string&, const std::string&, const std::int64_t&>, std::uint32_t>
      frames_;
};

void write_u64(detail::pickle_writer& w, std::string_view key, std::uint64_t v) {
  w.string(key);
  w.unsigned_integer(v);
}

void write_segment(detail::pickle_writer& w, stack_pickler& stacks, const snapshot_segment& s) {
  w.begin_dict();
  w.string("device");
  w.integer(s.device);
  write_u64(w, "address", s.address);
  write_u64(w, "total_size", s.total_size);
  write_u64(w, "allocated_size", s.allocated_size);
  write_u64(w, "active_size", s.active_size);
  write_u64(w, "requested_size", s.requested_size);
  write_u64(w, "stream", s.stream);
  w.string("segment_type");
  w.string(s.large ? "large" : "small");
  w.string("segment_pool_id");
  w.begin_tuple();
  w.integer(s.pool_id_first);
  w.integer(s.pool_id_second);
  w.end_tuple();
  w.string("is_expandable");
  w.boolean(s.is_expandable);
  w.string("frames");
  stacks.frames(s.stack);
  w.string("blocks");
  w.begin_list();
  for (const snapshot_block& b : s.blocks) {
    w.begin_dict();
    write_u64(w, "address", b.address);
    write_u64(w, "size", b.size);
    write_u64(w, "requested_size", b.requested_size);
    w.string("state");
    w.string(to_string(b.state));
    w.string("frames");
    stacks.frames(b.stack);
    w.end_dict();
  }
  w.end_list();
  w.end_dict();
}

void write_entry(detail::pickle_writer& w, stack_pickler& stacks, const trace_entry& e) {
  w.begin_dict();
  w.string("action");
  w.string(to_string(e.action));
  write_u64(w, e.action == trace_action::oom ? "device_free" : "addr", e.addr);
  write_u64(w, "size", e.size);
  write_u64(w, "stream", e.stream);
  write_u64(w, "time_us", e.time_us);
  w.string("frames");
  stacks.frames(e.stack);
  w.end_dict();
}

void write_setting(detail::pickle_writer& w, const snapshot_setting& v) {
  std::visit(
      [&w](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) {
          w.boolean(x);
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
          w.integer(x);
        } else if constexpr (std::is_same_v<T, double>) {
          w.real(x);
        } else {
          w.string(x);
        }
      },
      v);
}

}  // namespace

std::string_view to_string(trace_action a) noexcept {
  const auto i = static_cast<std::size_t>(a);
  return i < action_names.size() ? action_names[i] : "unknown";
}

bool parse_trace_action(std::string_view name, trace_action& out) noexcept {
  for (std::size_t i = 0; i < action_names.size(); ++i) {
    if (action_names[i] == name) {
      out = static_cast<trace_action>(i);
      return true;
    }
  }
  return false;
}

std::string_view to_string(block_state s) noexcept {
  const auto i = static_cast<std::size_t>(s);
  return i < state_names.size() ? state_names[i] : "unknown";
}

bool parse_block_state(std::string_view name, block_state& out) noexcept {
  for (std::size_t i = 0; i < state_names.size(); ++i) {
    if (state_names[i] == name) {
      out = static_cast<block_state>(i);
      return true;
    }
  }
  return false;
}

std::string memory_snapshot::to_pickle() const {
  detail::pickle_writer w;
  stack_pickler stack_writer(w, stacks);
  w.begin_dict();
  w.string("segments");
  w.begin_list();
  for (const snapshot_segment& s : segments) {
    write_segment(w, stack_writer, s);
  }
  w.end_list();
  w.string("device_traces");
  w.begin_list();
  for (const auto& trace : device_traces) {
    w.begin_list();
    for (const trace_entry& e : trace) {
      write_entry(w, stack_writer, e);
    }
    w.end_list();
  }
  w.end_list();
  w.string("allocator_settings");
  w.begin_dict();
  for (const auto& [key, value] : allocator_settings) {
    w.string(key);
    write_setting(w, value);
  }
  w.end_dict();
  w.end_dict();
  return w.finish();
}

}  // namespace poolscope::profiler
