#include "poolscope/darray/index_map.hpp"

#include <algorithm>
#include <utility>

namespace poolscope::darray {
namespace {

std::string shape_string(const shape_t& shape) {
  std::string s = "(";
  for (std::size_t axis = 0; axis < shape.size(); ++axis) {
    if (axis != 0) {
      s += ", ";
    }
    s += std::to_string(shape[axis]);
  }
  return s + ")";
}

std::string chunk_name(int device, std::size_t index) {
  return "device " + std::to_string(device) + " chunk " + std::to_string(index);
}

// Block `i` of `parts` equal blocks of [0, n): [i * (n / parts), (i + 1) * (n / parts)), the last
// block reaching n.
std::pair<std::int64_t, std::int64_t> block_bounds(std::int64_t n, std::int64_t parts,
                                                   std::int64_t i) {
  const std::int64_t len = n / parts;
  return {i * len, i + 1 == parts ? n : (i + 1) * len};
}

void check_axis(const shape_t& shape, std::size_t axis, const char* builder) {
  if (axis >= shape.size()) {
    throw invalid_index_map(std::string("index_map::") + builder + ": axis " +
                            std::to_string(axis) + " is not below the rank " +
                            std::to_string(shape.size()) + " of shape " + shape_string(shape));
  }
}

// Marks a map's contents shared. Looked at first: arrays copy their maps on every op, often the
// same map from several threads, and a store each time would move its cache line between them.
void mark_shared(std::atomic<bool>& unshared) noexcept {
  if (unshared.load(std::memory_order_relaxed)) {
    unshared.store(false, std::memory_order_relaxed);
  }
}

}  // namespace

index_map::index_map(const index_map& other) noexcept : parts_(other.parts_), unshared_(false) {
  mark_shared(other.unshared_);
}

index_map::index_map(index_map&& other) noexcept
    : parts_(std::move(other.parts_)), unshared_(other.unshared_.load(std::memory_order_relaxed)) {
  other.unshared_.store(true, std::memory_order_relaxed);  // empty now
}

index_map& index_map::operator=(const index_map& other) noexcept {
  if (this != &other) {
    mark_shared(other.unshared_);
    parts_ = other.parts_;
    unshared_.store(false, std::memory_order_relaxed);
  }
  return *this;
}

index_map& index_map::operator=(index_map&& other) noexcept {
  if (this != &other) {
    parts_ = std::move(other.parts_);
    unshared_.store(other.unshared_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    other.parts_.reset();
    other.unshared_.store(true, std::memory_order_relaxed);
  }
  return *this;
}

index_map& index_map::add(int device, box b) {
  if (!parts_) {
    parts_ = std::make_shared<parts_map>();
  } else if (!unshared_.load(std::memory_order_relaxed)) {
    // Shared (now or once) with another map: copy on write. The copy is ours alone.
    parts_ = std::make_shared<parts_map>(*parts_);
  }
  unshared_.store(true, std::memory_order_relaxed);
  (*parts_)[device].push_back(std::move(b));
  return *this;
}

const std::map<int, std::vector<box>>& index_map::parts() const noexcept {
  static const parts_map none;
  return parts_ ? *parts_ : none;
}

const std::vector<box>& index_map::boxes(int device) const {
  static const std::vector<box> none;
  const auto it = parts().find(device);
  return it == parts().end() ? none : it->second;
}

std::vector<chunk_ref> index_map::chunks() const {
  std::vector<chunk_ref> out;
  out.reserve(chunk_count());
  for (const auto& [device, list] : parts()) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      out.push_back(chunk_ref{device, i, list[i]});
    }
  }
  return out;
}

std::vector<int> index_map::devices() const {
  std::vector<int> out;
  for (const auto& [device, list] : parts()) {
    if (!list.empty()) {
      out.push_back(device);
    }
  }
  return out;
}

std::size_t index_map::chunk_count() const noexcept {
  std::size_t n = 0;
  for (const auto& entry : parts()) {
    n += entry.second.size();
  }
  return n;
}

void index_map::validate(const shape_t& shape, int device_count, bool require_cover) const {
  if (shape.size() > max_rank) {
    throw invalid_index_map("index_map: shape " + shape_string(shape) + " has rank " +
                            std::to_string(shape.size()) + ", more than the maximum " +
                            std::to_string(max_rank));
  }
  try {
    static_cast<void>(element_count(shape));
  } catch (const invalid_argument& e) {
    throw invalid_index_map("index_map: bad shape " + shape_string(shape) + ": " + e.what());
  }
  for (const auto& [device, list] : parts()) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      const box& b = list[i];
      if (device < 0 || device >= device_count) {
        throw invalid_index_map("index_map: " + chunk_name(device, i) + " " + b.to_string() +
                                ": device " + std::to_string(device) + " is not in [0, " +
                                std::to_string(device_count) + ")");
      }
      if (b.rank() != shape.size()) {
        throw invalid_index_map("index_map: " + chunk_name(device, i) + ": box " + b.to_string() +
                                " has rank " + std::to_string(b.rank()) + ", shape " +
                                shape_string(shape) + " has rank " + std::to_string(shape.size()));
      }
      for (std::size_t axis = 0; axis < b.rank(); ++axis) {
        const slice& s = b.dims[axis];
        if (s.step < 1) {
          throw invalid_index_map("index_map: " + chunk_name(device, i) + ": axis " +
                                  std::to_string(axis) + " slice " + s.to_string() + " has step " +
                                  std::to_string(s.step) + " (must be >= 1)");
        }
      }
      for (std::size_t axis = 0; axis < b.rank(); ++axis) {
        const slice& s = b.dims[axis];
        // Re-canonicalised so that a hand-set stop beyond the last index is judged by the last.
        const slice c{s.start, s.stop, s.step};
        if (!c.empty() && (c.start < 0 || c.last() >= shape[axis])) {
          throw invalid_index_map("index_map: " + chunk_name(device, i) + ": axis " +
                                  std::to_string(axis) + " slice " + s.to_string() +
                                  " lies outside [0, " + std::to_string(shape[axis]) +
                                  ") of shape " + shape_string(shape));
        }
      }
    }
  }
  if (!require_cover) {
    return;
  }
  std::vector<box> all;
  all.reserve(chunk_count());
  for (const auto& entry : parts()) {
    all.insert(all.end(), entry.second.begin(), entry.second.end());
  }
  const std::vector<box> uncovered = subtract_all(box::full(shape), all);
  if (uncovered.empty()) {
    return;
  }
  // Each box's first element is its starts; the smallest of those is the first uncovered index.
  std::vector<std::int64_t> first;
  for (const box& u : uncovered) {
    std::vector<std::int64_t> starts;
    for (const slice& s : u.dims) {
      starts.push_back(s.start);
    }
    if (first.empty() || starts < first) {
      first = std::move(starts);
    }
  }
  throw invalid_index_map("index_map: element " + shape_string(first) +
                          " is not covered by any chunk (shape " + shape_string(shape) + ")");
}

index_map index_map::deduplicated() const {
  index_map out;
  for (const auto& [device, list] : parts()) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      bool redundant = false;
      for (std::size_t j = 0; j < list.size() && !redundant; ++j) {
        // Drop i when another box holds it; of boxes holding each other, keep the first.
        redundant = j != i && list[j].contains(list[i]) && (j < i || !list[i].contains(list[j]));
      }
      if (!redundant) {
        out.add(device, list[i]);
      }
    }
  }
  return out;
}

std::string index_map::to_string() const {
  std::string s = "{";
  bool first_device = true;
  for (const auto& [device, list] : parts()) {
    if (!first_device) {
      s += ", ";
    }
    first_device = false;
    s += std::to_string(device) + ": [";
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (i != 0) {
        s += ", ";
      }
      s += list[i].to_string();
    }
    s += "]";
  }
  return s + "}";
}

index_map index_map::split(const shape_t& shape, std::size_t axis,
                           const std::vector<std::tuple<int, std::int64_t, std::int64_t>>& ranges) {
  check_axis(shape, axis, "split");
  index_map out;
  for (const auto& [device, start, stop] : ranges) {
    box b = box::full(shape);
    b.dims[axis] = slice{start, stop};
    out.add(device, std::move(b));
  }
  return out;
}

index_map index_map::blocks(const shape_t& shape, std::size_t axis, int devices) {
  check_axis(shape, axis, "blocks");
  if (devices < 1) {
    throw invalid_index_map("index_map::blocks: devices " + std::to_string(devices) +
                            " must be >= 1");
  }
  index_map out;
  for (int d = 0; d < devices; ++d) {
    const auto [start, stop] = block_bounds(shape[axis], devices, d);
    box b = box::full(shape);
    b.dims[axis] = slice{start, stop};
    out.add(d, std::move(b));
  }
  return out;
}

index_map index_map::replicated(const shape_t& shape, const std::vector<int>& devices) {
  index_map out;
  for (const int d : devices) {
    out.add(d, box::full(shape));
  }
  return out;
}

index_map index_map::grid(const shape_t& shape, std::int64_t row_blocks, std::int64_t col_blocks,
                          const std::vector<std::vector<int>>& device_of_block) {
  if (shape.size() != 2) {
    throw invalid_index_map("index_map::grid: shape " + shape_string(shape) + " is not 2-D");
  }
  if (row_blocks < 1 || col_blocks < 1) {
    throw invalid_index_map("index_map::grid: a grid of " + std::to_string(row_blocks) + " x " +
                            std::to_string(col_blocks) + " blocks is empty");
  }
  if (device_of_block.size() != static_cast<std::size_t>(row_blocks)) {
    throw invalid_index_map("index_map::grid: device_of_block has " +
                            std::to_string(device_of_block.size()) + " rows, expected " +
                            std::to_string(row_blocks));
  }
  index_map out;
  for (std::int64_t i = 0; i < row_blocks; ++i) {
    const auto& row = device_of_block[static_cast<std::size_t>(i)];
    if (row.size() != static_cast<std::size_t>(col_blocks)) {
      throw invalid_index_map("index_map::grid: row " + std::to_string(i) +
                              " of device_of_block has " + std::to_string(row.size()) +
                              " devices, expected " + std::to_string(col_blocks));
    }
    const auto [r0, r1] = block_bounds(shape[0], row_blocks, i);
    for (std::int64_t j = 0; j < col_blocks; ++j) {
      const auto [c0, c1] = block_bounds(shape[1], col_blocks, j);
      out.add(row[static_cast<std::size_t>(j)], box{{slice{r0, r1}, slice{c0, c1}}});
    }
  }
  return out;
}

}  // namespace poolscope::darray
