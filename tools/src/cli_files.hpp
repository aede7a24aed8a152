// The file arguments of the CLI's commands: a command whose output would overwrite one of its
// inputs or another of its outputs, or could not be written at all (a missing folder, a folder
// named as the file, no write permission), is refused before it does any work, so a long run is
// not lost at its end; an output named "-" goes to stdout.
//
//   check_file_arguments("poolscope replay", {{"LOG", cmd.file, false},
//                                             {"--json", cmd.json_path, true}});
//   write_output("poolscope replay", "--json", cmd.json_path, j.dump(2) + "\n");
//
// Header-only: cmd_replay.cpp is also compiled into the tools' tests. Thread safety: reentrant.
// Cost: a few stat calls per path.
#pragma once

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
/// the file (an existing one) or its folder (a new one) is not writable. Creates nothing.
inline void check_writable(std::string_view command, const file_argument& f) {
  namespace fs = std::filesystem;
  const std::string head = std::string(command) + ": " + f.option + " '" + f.path + "'";
  std::error_code ec;
  const fs::path p(f.path);
  const fs::file_status st = fs::status(p, ec);
  if (!ec && fs::exists(st)) {
    if (fs::is_directory(st)) {
      throw invalid_argument(head + " is a folder; name a file in it");
    }
    if (::access(f.path.c_str(), W_OK) != 0) {
      throw invalid_argument(head + " cannot be written: " + std::strerror(errno));
    }
    return;
  }
  const fs::path folder = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const fs::file_status fst = fs::status(folder, ec);
  if (ec || !fs::exists(fst)) {
    throw invalid_argument(head + ": its folder '" + folder.string() + "' does not exist");
  }
  if (!fs::is_directory(fst)) {
    throw invalid_argument(head + ": '" + folder.string() + "' is not a folder");
  }
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw invalid_argument(head + ": its folder '" + folder.string() +
                           "' cannot be written: " + std::strerror(errno));
  }
}

}  // namespace detail

/// Throws poolscope::invalid_argument, naming both arguments and the path, if an output of
/// `command` is the same file as one of its inputs (it would be destroyed) or as another output
/// (one would overwrite the other); naming the output, if it could not be written
/// (detail::check_writable).
inline void check_file_arguments(std::string_view command,
                                 const std::vector<file_argument>& files) {
  for (std::size_t i = 0; i < files.size(); ++i) {
    const file_argument& out = files[i];
    if (!out.output || !detail::is_file(out)) {
      continue;
    }
    detail::check_writable(command, out);
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
        throw invalid_argument(head + " is the same file as " + other.option + " '" + other.path +
                               "': one output would overwrite the other; give each its own path");
      }
      throw invalid_argument(head + " is the input " + other.option + " '" + other.path +
                             "': writing it would destroy the input; choose another path");
    }
  }
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
