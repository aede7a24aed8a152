// The file arguments of the CLI's commands: a command whose output would overwrite one of its
// inputs or another of its outputs, or an existing file (unless the command was given --force),
// or could not be written at all (a missing folder, a folder named as the file, no write
// permission), is refused before it does any work, so a long run is not lost at its end and no
// file is replaced silently; an output named "-" goes to stdout. Commands that write files
// nobody named write them into a fresh folder (fresh_output_folder) and say where.
//
//   check_file_arguments("poolscope replay", {{"LOG", cmd.file, false},
//                                             {"--json", cmd.json_path, true}});
//   write_output("poolscope replay", "--json", cmd.json_path, j.dump(2) + "\n");
//
// Header-only: cmd_replay.cpp is also compiled into the tools' tests. Thread safety: reentrant.
// Cost: a few stat calls per path.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "poolscope/error.hpp"

namespace poolscope::tools {

/// A mistake in the command line found after parsing (paths that clash, an output that exists):
/// the poolscope command exits 2 for it, as for CLI11's own refusals.
class usage_error : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// One file argument of a command: the option or positional that names it ("--json", "LOG"),
/// its path, and whether the command writes it. An empty path or "-" (stdout) is no file.
struct file_argument {
  std::string option;
  std::string path;
  bool output = false;
};

namespace detail {

/// `path` made absolute and normalised, with the symbolic links of its existing part resolved.
inline std::filesystem::path comparable_path(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) {
    p = path;
  }
  std::filesystem::path canonical = std::filesystem::weakly_canonical(p, ec);
  return ec ? p.lexically_normal() : canonical;
}

/// Whether two paths name one file whose data one of them would destroy: the same normalised
/// path, or one existing file reached by two names (a hard link). Only regular files (or paths
/// not yet there) count: /dev/null may take every output.
inline bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  const auto st = std::filesystem::status(a, ec);
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    return false;
  }
  if (comparable_path(a) == comparable_path(b)) {
    return true;
  }
  return std::filesystem::equivalent(a, b, ec) && !ec;
}

inline bool is_file(const file_argument& f) {
  return !f.path.empty() && f.path != "-";
}

/// Throws poolscope::invalid_argument, naming the command, the option and the path, if the output
/// `f` could not be written: its folder is missing or is not a folder, the path is a folder, or
/// the file (an existing one) or its folder (a new one) is not writable, or the file exists and
/// `may_overwrite` is false (usage_error for the clashes). Creates nothing.
inline void check_writable(std::string_view command, const file_argument& f, bool may_overwrite) {
  namespace fs = std::filesystem;
  const std::string head = std::string(command) + ": " + f.option + " '" + f.path + "'";
  std::error_code ec;
  const fs::path p(f.path);
  const fs::file_status st = fs::status(p, ec);
  if (!ec && fs::exists(st)) {
    if (fs::is_directory(st)) {
      throw usage_error(head + " is a folder; name a file in it");
    }
    if (!may_overwrite && fs::is_regular_file(st)) {
      throw usage_error(head + " exists; give another path, or --force to replace it");
    }
    if (::access(f.path.c_str(), W_OK) != 0) {
      throw usage_error(head + " cannot be written: " + std::strerror(errno));
    }
    return;
  }
  const fs::path folder = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const fs::file_status fst = fs::status(folder, ec);
  if (ec || !fs::exists(fst)) {
    throw usage_error(head + ": its folder '" + folder.string() + "' does not exist");
  }
  if (!fs::is_directory(fst)) {
    throw usage_error(head + ": '" + folder.string() + "' is not a folder");
  }
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw usage_error(head + ": its folder '" + folder.string() +
                      "' cannot be written: " + std::strerror(errno));
  }
}

}  // namespace detail

/// Throws poolscope::invalid_argument, naming both arguments and the path, if an output of
/// `command` is the same file as one of its inputs (it would be destroyed) or as another output
/// (one would overwrite the other); naming the output, if it could not be written
/// (detail::check_writable), or if it exists and `may_overwrite` (the command's --force) is false.
inline void check_file_arguments(std::string_view command, const std::vector<file_argument>& files,
                                 bool may_overwrite = false) {
  for (std::size_t i = 0; i < files.size(); ++i) {
    const file_argument& out = files[i];
    if (!out.output || !detail::is_file(out)) {
      continue;
    }
    for (std::size_t j = 0; j < files.size(); ++j) {
      const file_argument& other = files[j];
      // Each pair of outputs once; an output against every input.
      if (j == i || !detail::is_file(other) || (other.output && j > i)) {
        continue;
      }
      if (!detail::same_file(out.path, other.path)) {
        continue;
      }
      const std::string head = std::string(command) + ": " + out.option + " '" + out.path + "'";
      if (other.output) {
        throw usage_error(head + " is the same file as " + other.option + " '" + other.path +
                          "': one output would overwrite the other; give each its own path");
      }
      throw usage_error(head + " is the input " + other.option + " '" + other.path +
                        "': writing it would destroy the input; choose another path");
    }
  }
  // Then each output on its own (after the clashes, which say more about a path that exists).
  for (const file_argument& out : files) {
    if (out.output && detail::is_file(out)) {
      detail::check_writable(command, out, may_overwrite);
    }
  }
}

/// A new, empty folder for the outputs of one run of `command` (`stem`: "poolscope-demo"): made
/// in $TMPDIR (else /tmp) as stem-XXXXXX, so that a run never replaces an earlier run's files and
/// works from a folder it cannot write. Throws runtime_error naming the folder if it cannot be
/// made.
inline std::string fresh_output_folder(std::string_view command, const std::string& stem) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" + stem + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    throw runtime_error(std::string(command) + ": cannot make an output folder '" + templ +
                        "': " + std::strerror(errno));
  }
  return templ;
}

/// Writes `text` to the file `path`, or to stdout for "-". Throws poolscope::runtime_error naming
/// the command, the option and the path if the file cannot be written.
inline void write_output(std::string_view command, std::string_view option, const std::string& path,
                         const std::string& text) {
  if (path == "-") {
    std::cout << text;
    std::cout.flush();
    return;
  }
  std::ofstream f(path, std::ios::out | std::ios::trunc | std::ios::binary);
  f << text;
  f.close();
  if (!f) {
    throw runtime_error(std::string(command) + ": cannot write " + std::string(option) + " '" +
                        path + "'");
  }
}

}  // namespace poolscope::tools
