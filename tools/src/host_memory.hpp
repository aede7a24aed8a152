// Host memory for the CLI's up-front size checks: a command whose options ask for far more host
// memory than the machine has (`poolscope demo --n 17179869184`) is refused at once, naming the
// option, instead of running for minutes and dying of std::bad_alloc.
//
//   check_host_memory("poolscope demo", "--n 17179869184", needed_bytes);
//
// Header-only. Thread safety: reentrant. Cost: reads /proc/meminfo and the cgroup's limit.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>

#include "poolscope/error.hpp"

namespace poolscope::tools {

/// How much host memory a new allocation can count on, and where the figure comes from.
struct host_memory {
  std::uint64_t bytes = 0;  ///< 0: unknown
  std::string source;       ///< e.g. "MemAvailable in /proc/meminfo"
};

namespace detail {

/// The value of `key` ("MemAvailable:") in /proc/meminfo, in bytes; 0 if absent.
inline std::uint64_t meminfo_bytes(std::string_view key) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.starts_with(key)) {
      std::istringstream in(line.substr(key.size()));
      std::uint64_t kib = 0;
      in >> kib;
      return in ? kib * 1024 : 0;
    }
  }
  return 0;
}

/// The room left under this process's cgroup (v2) memory limit; max() when it has none.
inline std::uint64_t cgroup_room() {
  constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  std::string group;
  while (std::getline(self, line)) {
    if (line.starts_with("0::")) {
      group = line.substr(3);
    }
  }
  if (group.empty()) {
    return none;
  }
  const std::string dir = "/sys/fs/cgroup" + (group == "/" ? std::string() : group);
  std::ifstream max_file(dir + "/memory.max");
  std::ifstream current_file(dir + "/memory.current");
  std::uint64_t max = 0;
  std::uint64_t current = 0;
  if (!(max_file >> max) || !(current_file >> current)) {  // "max", or no such files
    return none;
  }
  return max > current ? max - current : 0;
}

}  // namespace detail

/// The host memory available now: MemAvailable from /proc/meminfo (else physical pages times the
/// page size), lowered to the room under this process's cgroup memory limit if that is less.
inline host_memory host_memory_available() {
  host_memory m;
  m.bytes = detail::meminfo_bytes("MemAvailable:");
  m.source = "MemAvailable in /proc/meminfo";
  if (m.bytes == 0) {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) {
      m.bytes = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
      m.source = "physical memory";
    }
  }
  const std::uint64_t room = detail::cgroup_room();
  if (room < m.bytes || m.bytes == 0) {
    m.bytes = room == std::numeric_limits<std::uint64_t>::max() ? 0 : room;
    m.source = "room under the cgroup's memory.max";
  }
  return m;
}

/// Formats a byte count given as a double (estimates may exceed 2^64): "1.50 GiB".
inline std::string format_estimate(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

/// Throws poolscope::invalid_argument if `needed_bytes` of host memory clearly cannot be had:
/// more than host_memory_available() (nothing is thrown when that is unknown). The message
/// names `command`, the option and value responsible (`what`, e.g. "--n 17179869184"), the
/// bytes needed and the bytes available.
inline void check_host_memory(std::string_view command, const std::string& what,
                              double needed_bytes) {
  const host_memory m = host_memory_available();
  if (m.bytes == 0 || needed_bytes <= static_cast<double>(m.bytes)) {
    return;
  }
  throw invalid_argument(std::string(command) + ": " + what + " needs at least " +
                         format_estimate(needed_bytes) + " of host memory, but " +
                         format_estimate(static_cast<double>(m.bytes)) + " is available (" +
                         m.source + "); choose a smaller size");
}

}  // namespace poolscope::tools
