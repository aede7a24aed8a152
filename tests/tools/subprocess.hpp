// Runs a program as a child process and captures its exit status, stdout and stderr.
//
//   auto r = poolscope::testing::run_process({"/path/to/poolscope", "demo", "--steps", "2"});
//   EXPECT_EQ(r.exit_code, 0) << r.err;
//
// Output goes through temporary files (no pipes, so a chatty child cannot block on a full pipe).
// With a timeout the child runs in a process group of its own, ended (SIGTERM, then SIGKILL) when
// the time is up: a child that hangs fails the test instead of hanging it.
// Not thread-safe with concurrent setenv; fine for tests.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace poolscope::testing {

struct process_result {
  int exit_code = -1;      ///< the exit status, or -1 if the child did not exit normally
  int signal = 0;          ///< the terminating signal, if any
  bool timed_out = false;  ///< ended because the timeout passed
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

namespace detail {
// Waits for `pid`; after `timeout` (0: none) ends its process group and notes it in `r`.
inline int wait_child(pid_t pid, std::chrono::seconds timeout, process_result& r) {
  int status = 0;
  if (timeout.count() == 0) {
    pid_t w = 0;
    do {
      w = ::waitpid(pid, &status, 0);
    } while (w < 0 && errno == EINTR);
    return w < 0 ? -1 : status;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int signal_sent = 0;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      return status;
    }
    if (w < 0 && errno != EINTR) {
      return -1;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline && signal_sent == 0) {
      r.timed_out = true;
      ::kill(-pid, SIGTERM);
      signal_sent = 1;
    } else if (now >= deadline + std::chrono::seconds(5) && signal_sent == 1) {
      ::kill(-pid, SIGKILL);
      signal_sent = 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}
}  // namespace detail

/// Runs argv[0] with `args`; `env` entries are set (or overridden) in the child's environment.
/// `timeout` (0: none) bounds how long the child (and its children) may run.
inline process_result run_process(const std::vector<std::string>& argv,
                                  const std::map<std::string, std::string>& env = {},
                                  std::chrono::seconds timeout = std::chrono::seconds(0)) {
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
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (timeout.count() > 0) {  // a group of its own, to end with everything it started
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
  }
  const int rc = posix_spawn(&pid, cargv[0], &fa, &attr, cargv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  if (rc == 0) {
    const int status = detail::wait_child(pid, timeout, r);
    if (status < 0) {
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
