// The poolscope command: one subcommand per cmd_<name>.cpp, registered below.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "launch.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/error.hpp"

#ifndef POOLSCOPE_VERSION
#define POOLSCOPE_VERSION "unknown"
#endif

namespace {

// "poolscope bench darray": the program and the subcommands that were parsed.
std::string command_name(const CLI::App& app) {
  std::string name = "poolscope";
  const CLI::App* at = &app;
  while (!at->get_subcommands().empty()) {
    at = at->get_subcommands().front();
    name += " " + at->get_name();
  }
  return name;
}

// For `poolscope foo` CLI11 says only "A subcommand is required": the first word that is neither
// an option nor a subcommand of a command that takes subcommands (poolscope, bench, trace) is
// named, with the commands there are. "" when the words are fine (CLI11 parses the rest).
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  std::string path = "poolscope";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const std::vector<CLI::App*> subs = at->get_subcommands([](CLI::App*) { return true; });
    if (word.starts_with("-") || subs.empty()) {
      return {};  // an option, or a command's own arguments
    }
    const auto it = std::find_if(subs.begin(), subs.end(),
                                 [&word](const CLI::App* s) { return s->check_name(word); });
    if (it == subs.end()) {
      std::string names;
      for (const CLI::App* s : subs) {
        names += (names.empty() ? "" : ", ") + s->get_name();
      }
      return path + ": unknown command '" + word + "' (the commands are " + names + ")";
    }
    at = *it;
    path += " " + (*it)->get_name();
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"poolscope: GPU memory pools and profiling"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "poolscope " POOLSCOPE_VERSION);
  poolscope::tools::register_demo(app);
  poolscope::tools::register_pools(app);
  poolscope::tools::register_bench(app);
  poolscope::tools::register_replay(app);
  poolscope::tools::register_snapshot(app);
  poolscope::tools::register_report(app);
  poolscope::tools::register_trace(app);
  if (const std::string unknown = unknown_command(app, argc, argv); !unknown.empty()) {
    std::fprintf(stderr, "%s\nRun with --help for more information.\n", unknown.c_str());
    return 1;
  }
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0 || !poolscope::tools::runs_on_every_rank(argc, argv)) {
        return app.exit(e);
      }
      // Under a launcher the other ranks wait for this one's word on its arguments: the refusal
      // is every rank's, in the same words (agree_on_arguments throws it here too).
      const auto group = poolscope::darray::process_group::from_launcher();
      try {
        poolscope::tools::agree_on_arguments(*group, command_name(app), e.what());
      } catch (const poolscope::invalid_argument& refused) {
        std::fprintf(stderr, "%s\n", refused.what());
      }
      return e.get_exit_code();
    }
  } catch (const poolscope::out_of_memory& e) {
    // An allocator's own report: what was asked, what the pool held, why it failed.
    std::fprintf(stderr, "%s: %s\n", command_name(app).c_str(), e.what());
    return 1;
  } catch (const std::bad_alloc& e) {
    std::fprintf(stderr,
                 "%s: out of host memory (%s): what its options ask for does not fit in the "
                 "memory this process may use; try smaller sizes\n",
                 command_name(app).c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    // poolscope's own messages already start with "poolscope: " or "poolscope <command>: ".
    const std::string_view what = e.what();
    const std::string prefix = what.starts_with("poolscope") ? "" : command_name(app) + ": ";
    std::fprintf(stderr, "%s%.*s\n", prefix.c_str(), static_cast<int>(what.size()), what.data());
    return 1;
  }
  return 0;
}
