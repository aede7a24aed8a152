// Every rank's file on rank 0's side (rank_files.hpp).
#include "rank_files.hpp"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace poolscope::tools {

namespace {

// A file's bytes (false when it cannot be read).
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

// Where rank 0 keeps its copy of a rank's file: that same path when its folder exists here, else
// in `fallback_dir`.
std::string copy_path(const std::string& theirs, const std::string& fallback_dir) {
  const std::filesystem::path p(theirs);
  std::error_code ec;
  const std::filesystem::path dir = p.parent_path().empty() ? "." : p.parent_path();
  if (std::filesystem::is_directory(dir, ec)) {
    return theirs;
  }
  return (std::filesystem::path(fallback_dir) / p.filename()).string();
}

// The tag of the files' bytes (the highest MPI guarantees): sent once every rank's backend work
// is over, so no piece of a reshard shares it.
constexpr int file_bytes_tag = 32767;

}  // namespace

rank_files gather_rank_files(darray::process_group& g, const std::string& mine,
                             const std::string& fallback_dir, const std::string& what) {
  std::string bytes;
  const bool readable = read_bytes(mine, bytes);
  rank_files f;
  f.paths = g.all_gather(mine);
  const std::vector<std::string> prints = g.all_gather(fingerprint(bytes, readable));
  std::string wanted(f.paths.size(), '0');
  if (g.rank() == 0) {
    for (std::size_t r = 1; r < f.paths.size(); ++r) {
      std::string here;
      const bool seen = read_bytes(f.paths[r], here);
      if (prints[r] != "-" && fingerprint(here, seen) != prints[r]) {
        wanted[r] = '1';
      }
    }
  }
  wanted = g.all_gather(g.rank() == 0 ? wanted : std::string()).front();
  if (g.rank() != 0) {
    if (wanted[static_cast<std::size_t>(g.rank())] == '1') {
      g.send(bytes.data(), bytes.size(), 0, file_bytes_tag);
    }
    return f;
  }
  for (std::size_t r = 1; r < f.paths.size(); ++r) {
    if (wanted[r] != '1') {
      continue;
    }
    // prints[r] is "size:hash": the size comes first.
    std::string theirs(std::stoull(prints[r]), '\0');
    g.receive(theirs.data(), theirs.size(), static_cast<int>(r), file_bytes_tag);
    f.paths[r] = copy_path(f.paths[r], fallback_dir);
    std::ofstream out(f.paths[r], std::ios::binary | std::ios::trunc);
    out.write(theirs.data(), static_cast<std::streamsize>(theirs.size()));
    out.close();
    if (!out && f.problem.empty()) {
      f.problem = "rank 0 could not write rank " + std::to_string(r) + "'s " + what + " to '" +
                  f.paths[r] + "'";
    }
  }
  for (std::size_t r = 0; r < f.paths.size(); ++r) {
    if (prints[r] == "-" && f.problem.empty()) {
      f.problem =
          "rank " + std::to_string(r) + " could not read its own " + what + " '" + f.paths[r] + "'";
    }
  }
  return f;
}

}  // namespace poolscope::tools
