// Runs a program as a child process and captures its exit status, stdout and stderr.
//
//   auto r = poolscope::testing::run_process({"/path/to/poolscope", "demo", "--steps", "2"});
//   EXPECT_EQ(r.exit_code, 0) << r.err;
//
// Output goes through temporary files (no pipes, so a chatty child cannot block on a full pipe).
// Not thread-safe with concurrent setenv; fine for tests.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace poolscope::testing {

struct process_result {
  int exit_code = -1;  ///< the exit status, or -1 if the child did not exit normally
  int signal = 0;      ///< the terminating signal, if any
  std::string out;
  std::string err;
};

/// A fresh file name under TMPDIR (or /tmp); the file is created empty.
inline std::string temp_path(const std::string& stem) {
  const char* dir = std::getenv("TMPDIR");
  std::string tmpl = std::string(dir != nullptr ? dir : "/tmp") + "/" + stem + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const int fd = ::mkstemp(buf.data());
  if (fd >= 0) {
    ::close(fd);
  }
  return std::string(buf.data());
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// Runs argv[0] with `args`; `env` entries are set (or overridden) in the child's environment.
inline process_result run_process(const std::vector<std::string>& argv,
                                  const std::map<std::string, std::string>& env = {}) {
  process_result r;
  const std::string out_path = temp_path("poolscope-out");
  const std::string err_path = temp_path("poolscope-err");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_TRUNC, 0600);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    const auto eq = kv.find('=');
    if (eq != std::string::npos && env.count(kv.substr(0, eq)) != 0) {
      continue;
    }
    env_strings.push_back(kv);
  }
  for (const auto& [k, v] : env) {
    env_strings.push_back(k + "=" + v);
  }
  std::vector<char*> envp;
  for (auto& s : env_strings) {
    envp.push_back(s.data());
  }
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) {
    cargv.push_back(a.data());
  }
  cargv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc == 0) {
    int status = 0;
    pid_t w = 0;
    do {
      w = ::waitpid(pid, &status, 0);
    } while (w < 0 && errno == EINTR);
    if (w < 0) {
      r.err = "waitpid failed";
    } else if (WIFEXITED(status)) {
      r.exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      r.signal = WTERMSIG(status);
    }
  } else {
    r.err = "posix_spawn failed: " + std::to_string(rc);
  }
  r.out = read_file(out_path);
  r.err += read_file(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return r;
}

/// The last non-empty line of `text`.
inline std::string last_line(const std::string& text) {
  std::string s = text;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) {
    s.pop_back();
  }
  const auto nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

}  // namespace poolscope::testing
