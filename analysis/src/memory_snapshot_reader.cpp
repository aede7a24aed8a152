#include "poolscope/analysis/memory_snapshot_reader.hpp"

#include <fstream>
#include <iterator>
#include <unordered_map>

#include "poolscope/analysis/pickle_reader.hpp"

namespace poolscope::analysis {

using profiler::block_state;
using profiler::memory_snapshot;
using profiler::snapshot_block;
using profiler::snapshot_frame;
using profiler::snapshot_segment;
using profiler::trace_action;
using profiler::trace_entry;

snapshot_error::snapshot_error(const std::string& source, const std::string& field,
                               const std::string& what)
    : runtime_error("poolscope: " + source + ": " + field + ": " + what), field_(field) {}

bool looks_like_pickle(std::string_view head) noexcept {
  return head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x80 &&
         static_cast<unsigned char>(head[1]) >= 2 && static_cast<unsigned char>(head[1]) <= 5;
}

namespace {

/// Where a value sits in the document, rendered only for an error: "segments[3].blocks[1]".
struct path {
  const path* parent = nullptr;
  std::string_view key;  // a dict key, or empty for an index
  std::size_t index = 0;

  [[nodiscard]] std::string str() const {
    if (parent == nullptr) {
      return std::string(key);  // the document itself: ""
    }
    std::string up = parent->str();
    if (!key.empty()) {
      return up.empty() ? std::string(key) : up + "." + std::string(key);
    }
    return up + "[" + std::to_string(index) + "]";
  }
};

/// A value for a message: its type, and a scalar's value ("int -5", "str 'big'").
std::string shown(const pickle_value& v) {
  std::string out(v.type_name());
  if (v.is_int64()) {
    out += " " + std::to_string(v.as_int64());
  } else if (v.is_uint64()) {
    out += " " + std::to_string(v.as_uint64());
  } else if (v.is_string() && v.as_string().size() <= 64) {
    out += " '" + v.as_string() + "'";
  }
  return out;
}

struct frames_hash {
  std::size_t operator()(const std::vector<snapshot_frame>& v) const noexcept {
    std::size_t h = v.size();
    for (const snapshot_frame& f : v) {
      h = h * 31 + std::hash<std::string>{}(f.name);
      h = h * 31 + std::hash<std::string>{}(f.filename);
      h = h * 31 + std::hash<std::int64_t>{}(f.line);
    }
    return h;
  }
};

class snapshot_parser {
 public:
  explicit snapshot_parser(const std::string& source) : source_(source) {}

  memory_snapshot run(const pickle_value& root) {
    const path top{};
    if (root.is_sequence()) {  // segments alone, as PyTorch's tools read such a file
      read_segments(root, path{&top, "segments"});
      return std::move(out_);
    }
    if (root.kind() != pickle_value::type::dict) {
      fail(top, "the snapshot", root, "a dict (or a list of segments)");
    }
    const pickle_value* segments = root.find("segments");
    if (segments == nullptr) {
      throw snapshot_error(source_, "segments", "missing: not a memory snapshot");
    }
    read_segments(*segments, path{&top, "segments"});
    if (const pickle_value* traces = root.find("device_traces"); traces != nullptr) {
      read_traces(*traces, path{&top, "device_traces"});
    }
    if (const pickle_value* settings = root.find("allocator_settings"); settings != nullptr) {
      read_settings(*settings, path{&top, "allocator_settings"});
    }
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const path& at, std::string_view what_field, const pickle_value& got,
                         const std::string& expected) const {
    const std::string where = at.str();
    throw snapshot_error(source_, where.empty() ? std::string(what_field) : where,
                         "expected " + expected + ", got " + shown(got));
  }

  const pickle_value& need(const pickle_value& dict, std::string_view key, const path& at) const {
    const pickle_value* v = dict.find(key);
    if (v == nullptr) {
      throw snapshot_error(source_, path{&at, key}.str(), "missing");
    }
    return *v;
  }
  const std::vector<pickle_value>& sequence(const pickle_value& v, const path& at) const {
    if (!v.is_sequence()) {
      fail(at, "", v, "a list");
    }
    return v.items();
  }
  void need_dict(const pickle_value& v, const path& at) const {
    if (v.kind() != pickle_value::type::dict) {
      fail(at, "", v, "a dict");
    }
  }
  std::uint64_t u64(const pickle_value& dict, std::string_view key, const path& at) const {
    const pickle_value& v = need(dict, key, at);
    if (!v.is_uint64()) {
      fail(path{&at, key}, key, v, "an int >= 0");
    }
    return v.as_uint64();
  }
  std::uint64_t u64_or(const pickle_value& dict, std::string_view key, const path& at,
                       std::uint64_t fallback) const {
    return dict.find(key) != nullptr ? u64(dict, key, at) : fallback;
  }
  /// An int of either sign, kept as its 64 bits (PyTorch writes a stream handle as int64).
  std::uint64_t bits_or(const pickle_value& dict, std::string_view key, const path& at,
                        std::uint64_t fallback) const {
    const pickle_value* v = dict.find(key);
    if (v == nullptr) {
      return fallback;
    }
    if (!v->is_int()) {
      fail(path{&at, key}, key, *v, "an int");
    }
    return v->is_uint64() ? v->as_uint64() : static_cast<std::uint64_t>(v->as_int64());
  }
  std::string text(const pickle_value& dict, std::string_view key, const path& at) const {
    const pickle_value& v = need(dict, key, at);
    if (!v.is_string()) {
      fail(path{&at, key}, key, v, "a str");
    }
    return v.as_string();
  }

  std::uint32_t read_frames(const pickle_value& owner, const path& at) {
    const pickle_value* frames = owner.find("frames");
    if (frames == nullptr) {
      return 0;
    }
    const path here{&at, "frames"};
    if (auto it = by_identity_.find(frames->identity());
        frames->identity() != nullptr && it != by_identity_.end()) {
      return it->second;
    }
    std::vector<snapshot_frame> stack;
    const auto& items = sequence(*frames, here);
    stack.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      const path fp{&here, {}, i};
      need_dict(items[i], fp);
      snapshot_frame f;
      f.name = text(items[i], "name", fp);
      f.filename = text(items[i], "filename", fp);
      const pickle_value& line = need(items[i], "line", fp);
      if (!line.is_int64()) {
        fail(path{&fp, "line"}, "line", line, "an int");
      }
      f.line = line.as_int64();
      stack.push_back(std::move(f));
    }
    std::uint32_t id = 0;
    if (!stack.empty()) {
      auto [it, fresh] = by_content_.emplace(stack, static_cast<std::uint32_t>(out_.stacks.size()));
      if (fresh) {
        out_.stacks.push_back(std::move(stack));
      }
      id = it->second;
    }
    if (frames->identity() != nullptr) {
      by_identity_.emplace(frames->identity(), id);
    }
    return id;
  }

  void read_segments(const pickle_value& v, const path& at) {
    const auto& items = sequence(v, at);
    out_.segments.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      out_.segments.push_back(read_segment(items[i], path{&at, {}, i}));
    }
  }

  snapshot_segment read_segment(const pickle_value& v, const path& at) {
    need_dict(v, at);
    snapshot_segment s;
    s.address = u64(v, "address", at);
    s.total_size = u64(v, "total_size", at);
    s.device = static_cast<std::int64_t>(bits_or(v, "device", at, 0));
    s.stream = bits_or(v, "stream", at, 0);
    if (const pickle_value* t = v.find("segment_type"); t != nullptr) {
      const std::string type = text(v, "segment_type", at);
      if (type != "large" && type != "small") {
        throw snapshot_error(source_, path{&at, "segment_type"}.str(),
                             "'" + type + "' is neither 'large' nor 'small'");
      }
      s.large = type == "large";
    }
    if (const pickle_value* pool = v.find("segment_pool_id"); pool != nullptr) {
      const path pp{&at, "segment_pool_id"};
      const auto& ids = sequence(*pool, pp);
      if (ids.size() != 2 || !ids[0].is_int64() || !ids[1].is_int64()) {
        throw snapshot_error(source_, pp.str(), "expected a pair of ints");
      }
      s.pool_id_first = ids[0].as_int64();
      s.pool_id_second = ids[1].as_int64();
    }
    if (const pickle_value* e = v.find("is_expandable"); e != nullptr) {
      if (e->kind() != pickle_value::type::boolean) {
        fail(path{&at, "is_expandable"}, "is_expandable", *e, "a bool");
      }
      s.is_expandable = e->as_bool();
    }
    s.stack = read_frames(v, at);
    read_blocks(v, at, s);
    s.allocated_size = u64_or(v, "allocated_size", at, s.allocated_size);
    s.active_size = u64_or(v, "active_size", at, s.active_size);
    s.requested_size = u64_or(v, "requested_size", at, s.requested_size);
    return s;
  }

  /// Reads the blocks and checks that they tile the segment; fills the size sums from them.
  void read_blocks(const pickle_value& seg, const path& at, snapshot_segment& s) {
    const path bp{&at, "blocks"};
    const auto& items = sequence(need(seg, "blocks", at), bp);
    std::uint64_t running = s.address;
    std::uint64_t covered = 0;
    s.blocks.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      const path here{&bp, {}, i};
      const pickle_value& b = items[i];
      need_dict(b, here);
      snapshot_block out;
      out.size = u64(b, "size", here);
      out.address = u64_or(b, "address", here, running);
      if (out.address != running) {
        throw snapshot_error(source_, path{&here, "address"}.str(),
                             std::to_string(out.address) +
                                 " is not where the blocks before it end (" +
                                 std::to_string(running) + "): the blocks do not tile the segment");
      }
      out.requested_size = u64_or(b, "requested_size", here, out.size);
      const std::string state = text(b, "state", here);
      if (!profiler::parse_block_state(state, out.state)) {
        throw snapshot_error(source_, path{&here, "state"}.str(),
                             "unknown block state '" + state + "'");
      }
      out.stack = read_frames(b, here);
      if (out.size > s.total_size - covered) {
        throw snapshot_error(
            source_, path{&here, "size"}.str(),
            "the blocks reach past the segment's total_size " + std::to_string(s.total_size));
      }
      covered += out.size;
      running += out.size;
      if (out.state != block_state::inactive) {
        s.active_size += out.size;
      }
      if (out.state == block_state::active_allocated) {
        s.allocated_size += out.size;
        s.requested_size += out.requested_size;
      }
      s.blocks.push_back(out);
    }
    if (covered != s.total_size) {
      throw snapshot_error(source_, bp.str(),
                           "the block sizes sum to " + std::to_string(covered) +
                               ", the segment's total_size is " + std::to_string(s.total_size) +
                               ": the blocks do not tile the segment");
    }
  }

  void read_traces(const pickle_value& v, const path& at) {
    const auto& devices = sequence(v, at);
    out_.device_traces.resize(devices.size());
    for (std::size_t d = 0; d < devices.size(); ++d) {
      const path dp{&at, {}, d};
      const auto& entries = sequence(devices[d], dp);
      auto& trace = out_.device_traces[d];
      trace.reserve(entries.size());
      for (std::size_t i = 0; i < entries.size(); ++i) {
        trace.push_back(read_entry(entries[i], path{&dp, {}, i}));
      }
    }
  }

  trace_entry read_entry(const pickle_value& v, const path& at) {
    need_dict(v, at);
    trace_entry e;
    const std::string action = text(v, "action", at);
    if (!profiler::parse_trace_action(action, e.action)) {
      throw snapshot_error(source_, path{&at, "action"}.str(), "unknown action '" + action + "'");
    }
    if (e.action == trace_action::oom) {
      e.addr = u64_or(v, "device_free", at, 0);
    } else if (e.action != trace_action::snapshot) {
      e.addr = u64(v, "addr", at);
    }
    e.size = e.action == trace_action::snapshot ? u64_or(v, "size", at, 0) : u64(v, "size", at);
    e.stream = bits_or(v, "stream", at, 0);
    e.time_us = bits_or(v, "time_us", at, 0);
    e.stack = read_frames(v, at);
    return e;
  }

  void read_settings(const pickle_value& v, const path& at) {
    need_dict(v, at);
    for (const auto& [key, value] : v.entries()) {
      if (!key.is_string()) {
        continue;
      }
      switch (value.kind()) {
        case pickle_value::type::boolean:
          out_.allocator_settings.emplace_back(key.as_string(), value.as_bool());
          break;
        case pickle_value::type::integer:
          if (value.is_int64()) {
            out_.allocator_settings.emplace_back(key.as_string(), value.as_int64());
          }
          break;
        case pickle_value::type::real:
          out_.allocator_settings.emplace_back(key.as_string(), value.as_real());
          break;
        case pickle_value::type::string:
          out_.allocator_settings.emplace_back(key.as_string(), value.as_string());
          break;
        default:
          break;  // nested settings (roundup_power2_divisions) are not kept
      }
    }
  }

  const std::string& source_;
  memory_snapshot out_;
  std::unordered_map<const void*, std::uint32_t> by_identity_;
  std::unordered_map<std::vector<snapshot_frame>, std::uint32_t, frames_hash> by_content_;
};

}  // namespace

memory_snapshot parse_memory_snapshot(std::string_view bytes, const std::string& source) {
  const pickle_value root = read_pickle(bytes, source);
  return snapshot_parser(source).run(root);
}

memory_snapshot read_memory_snapshot(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw runtime_error("poolscope: cannot open snapshot '" + path + "'");
  }
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) {
    throw runtime_error("poolscope: cannot read snapshot '" + path + "'");
  }
  return parse_memory_snapshot(bytes, path);
}

}  // namespace poolscope::analysis
