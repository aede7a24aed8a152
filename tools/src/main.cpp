// The poolscope command: one subcommand per cmd_<name>.cpp, registered below.
//
// Every error is one line on stderr, "poolscope <command>: <message>", and the exit code says
// what kind it was (README, "Exit codes"; `poolscope --help`):
//   0  done: what was run or checked is fine
//   1  the checked thing failed: a check against the host, a trace with problems, an input file
//      that cannot be read or holds nothing usable, an allocation that does not fit
//   2  usage: the command line is wrong (an unknown command or option, a bad value, a missing
//      argument, outputs that clash or exist); CLI11's own codes are mapped to it
#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cli_files.hpp"
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

constexpr int exit_failed = 1;
constexpr int exit_usage = 2;

constexpr const char* exit_codes_help =
    "Exit codes: 0 done; 1 the checked thing failed (a check, a trace with problems, an input "
    "that cannot be read or holds nothing usable); 2 usage error (unknown command or option, "
    "bad value, missing argument, outputs that clash or exist).";

// `what` with the prefixes the layers below put on their messages taken off ("poolscope: ",
// "poolscope replay: ", the command's own name), so that every message is printed once as
// "<command>: <message>".
std::string bare_message(const std::string& command, std::string_view what) {
  if (what.starts_with(command + ": ")) {
    what.remove_prefix(command.size() + 2);
  } else if (what.starts_with("poolscope")) {
    const std::size_t colon = what.find(": ");
    const std::string_view head = what.substr(0, colon);
    // "poolscope: ..." or "poolscope <words>: ..." (a command name, no spaces in its words'
    // place of a message).
    if (colon != std::string_view::npos && head.find_first_of("'\"(") == std::string_view::npos) {
      what.remove_prefix(colon + 2);
    }
  }
  return std::string(what);
}

// Prints "<command>: <message>" (the message without its own prefixes) and returns `code`.
int report_error(const std::string& command, std::string_view what, int code,
                 bool hint_help = false) {
  std::fprintf(stderr, "%s: %s\n", command.c_str(), bare_message(command, what).c_str());
  if (hint_help) {
    std::fprintf(stderr, "Run %s --help for more information.\n", command.c_str());
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"poolscope: GPU memory pools and profiling"};
  app.footer(exit_codes_help);
  app.require_subcommand(1);
  app.set_version_flag("--version", "poolscope " POOLSCOPE_VERSION);
  poolscope::tools::register_demo(app);
  poolscope::tools::register_pools(app);
  poolscope::tools::register_bench(app);
  poolscope::tools::register_replay(app);
  poolscope::tools::register_snapshot(app);
  poolscope::tools::register_report(app);
  poolscope::tools::register_trace(app);
  // Every command's --help ends with the exit codes.
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    sub->footer(exit_codes_help);
    for (CLI::App* leaf : sub->get_subcommands([](CLI::App*) { return true; })) {
      leaf->footer(exit_codes_help);
    }
  }
  if (const std::string unknown = unknown_command(app, argc, argv); !unknown.empty()) {
    std::fprintf(stderr, "%s\nRun poolscope --help for more information.\n", unknown.c_str());
    return exit_usage;
  }
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::RuntimeError& e) {
      // A callback's quiet exit: what it checked failed, and it has said why.
      return e.get_exit_code() == 0 ? 0 : exit_failed;
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) {
        return app.exit(e);  // --help, --version
      }
      if (!poolscope::tools::runs_on_every_rank(argc, argv)) {
        return report_error(command_name(app), e.what(), exit_usage, true);
      }
      // Under a launcher the other ranks wait for this one's word on its arguments: the refusal
      // is every rank's, in the same words (agree_on_arguments throws it here too).
      const auto group = poolscope::darray::process_group::from_launcher();
      try {
        poolscope::tools::agree_on_arguments(*group, command_name(app), e.what());
      } catch (const poolscope::invalid_argument& refused) {
        return report_error(command_name(app), refused.what(), exit_usage);
      }
      return exit_usage;
    }
  } catch (const poolscope::tools::usage_error& e) {
    return report_error(command_name(app), e.what(), exit_usage);
  } catch (const poolscope::out_of_memory& e) {
    // An allocator's own report: what was asked, what the pool held, why it failed.
    return report_error(command_name(app), e.what(), exit_failed);
  } catch (const std::bad_alloc& e) {
    return report_error(command_name(app),
                        std::string("out of host memory (") + e.what() +
                            "): what its options ask for does not fit in the memory this "
                            "process may use; try smaller sizes",
                        exit_failed);
  } catch (const std::exception& e) {
    return report_error(command_name(app), e.what(), exit_failed);
  }
  return 0;
}
