// One trace of every rank (rank_traces.hpp).
#include "rank_traces.hpp"

#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "launch.hpp"
#include "poolscope/analysis/trace_check.hpp"
#include "poolscope/analysis/trace_merge.hpp"

namespace poolscope::tools {

namespace {
std::string us_text(const char* f, std::int64_t ns) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, static_cast<double>(ns) / 1e3);
  return buf;
}

// "N events, a process per rank, K piece flows between ranks; one host, one clock (...)".
std::string summary_of(const analysis::merge_result& r, std::uint64_t events) {
  std::string s = std::to_string(events) + " events, a process per rank, " +
                  std::to_string(r.flows) + " piece flows between ranks; ";
  if (!r.clocks_measured) {
    return s + "clocks not sampled";
  }
  if (r.max_skew_ns == 0 && r.max_uncertainty_ns == 0) {
    return s + us_text("one host, one clock (barriers measured up to %.1f us)",
                       r.max_same_host_offset_ns);
  }
  return s + us_text("clock skew %.1f us", r.max_skew_ns) +
         us_text(", aligned to within %.1f us", r.max_uncertainty_ns);
}

// A file's bytes ("" and false when it cannot be read).
bool read_bytes(const std::string& path, std::string& bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return false;
  }
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

// "size:fnv1a" of a file's bytes, or "-" when it cannot be read: rank 0 compares the one it sees
// at a rank's path with that rank's own.
std::string fingerprint(const std::string& bytes, bool readable) {
  if (!readable) {
    return "-";
  }
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : bytes) {
    h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%zu:%016llx", bytes.size(), static_cast<unsigned long long>(h));
  return buf;
}

// Where rank 0 keeps the copy of a rank's trace it cannot see: that same path when its folder
// exists here (nodes with disks of their own then end with every rank's file on rank 0's, as on
// a shared one), else beside the merged trace.
std::string copy_path(const std::string& theirs, const std::string& merged) {
  const std::filesystem::path p(theirs);
  std::error_code ec;
  const std::filesystem::path dir = p.parent_path().empty() ? "." : p.parent_path();
  if (std::filesystem::is_directory(dir, ec)) {
    return theirs;
  }
  return (std::filesystem::path(merged).parent_path() / p.filename()).string();
}

// The tag of the traces' bytes: sent once every rank's backend work is over.
constexpr int trace_bytes_tag = 32767;

// Rank 0 reads every rank's trace where it sees the same bytes at that rank's path (one file
// system, or a shared one); a rank whose file it cannot see there (a node of its own disk, another
// working directory, a stale file of that name) sends it the bytes by the group's MPI.
std::vector<std::string> gather_rank_traces(darray::process_group& g, const std::string& mine,
                                            const std::string& merged, std::string& problem) {
  std::string bytes;
  const bool readable = read_bytes(mine, bytes);
  const std::vector<std::string> paths = g.all_gather(mine);
  const std::vector<std::string> prints = g.all_gather(fingerprint(bytes, readable));
  std::string wanted(paths.size(), '0');
  if (g.rank() == 0) {
    for (std::size_t r = 1; r < paths.size(); ++r) {
      std::string here;
      const bool seen = read_bytes(paths[r], here);
      if (prints[r] != "-" && fingerprint(here, seen) != prints[r]) {
        wanted[r] = '1';
      }
    }
  }
  wanted = g.all_gather(g.rank() == 0 ? wanted : std::string()).front();
  std::vector<std::string> local = paths;
  if (g.rank() != 0 && wanted[static_cast<std::size_t>(g.rank())] == '1') {
    g.send(bytes.data(), bytes.size(), 0, trace_bytes_tag);
  } else if (g.rank() == 0) {
    for (std::size_t r = 1; r < paths.size(); ++r) {
      if (wanted[r] != '1') {
        continue;
      }
      // prints[r] is "size:hash": the size comes first.
      std::string theirs(std::stoull(prints[r]), '\0');
      g.receive(theirs.data(), theirs.size(), static_cast<int>(r), trace_bytes_tag);
      local[r] = copy_path(paths[r], merged);
      std::ofstream out(local[r], std::ios::binary | std::ios::trunc);
      out.write(theirs.data(), static_cast<std::streamsize>(theirs.size()));
      out.close();
      if (!out && problem.empty()) {
        problem =
            "rank 0 could not write rank " + std::to_string(r) + "'s trace to '" + local[r] + "'";
      }
    }
    for (std::size_t r = 0; r < paths.size(); ++r) {
      if (prints[r] == "-" && problem.empty()) {
        problem = "rank " + std::to_string(r) + " could not read its own trace '" + paths[r] + "'";
      }
    }
  }
  return local;
}

}  // namespace

merged_trace merge_rank_traces(darray::process_group& g, const std::string& requested,
                               const std::string& mine) {
  merged_trace m;
  m.path = merged_output_path(requested);
  std::string problem;
  const std::vector<std::string> paths = gather_rank_traces(g, mine, m.path, problem);
  if (g.rank() == 0 && !problem.empty()) {
    m.problem = problem;
  } else if (g.rank() == 0) {
    try {
      const analysis::merge_result r = analysis::merge_traces(paths, m.path);
      const auto check = analysis::check_trace(m.path);
      if (!check.ok()) {
        m.problem = check.to_text();
      }
      m.summary = summary_of(r, check.events);
    } catch (const std::exception& e) {
      m.problem = e.what();
    }
  }
  // Rank 0's verdict on every rank ("ok", or "x" and the problem).
  const std::string verdict =
      g.all_gather(g.rank() == 0 ? (m.problem.empty() ? "ok" : "x" + m.problem) : "").front();
  m.problem = verdict == "ok" ? std::string() : verdict.substr(1);
  return m;
}

}  // namespace poolscope::tools
