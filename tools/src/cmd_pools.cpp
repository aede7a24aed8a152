// `poolscope pools`: every allocator strategy on one trace, with integrity checks and a pool
// report (see pools_demo.hpp). Exit code 1 on an integrity failure or if a strategy failed
// otherwise, 2 for a usage error.
#include <iostream>
#include <memory>

#include "cli_checks.hpp"
#include "cli_files.hpp"
#include "commands.hpp"
#include "output_option.hpp"
#include "pools_demo.hpp"
#include "poolscope/error.hpp"
#include "poolscope/pool/factory.hpp"

namespace poolscope::tools {

namespace {
struct demo_command {
  demo_options options;
  std::string json_path;
  bool force = false;
};
}  // namespace

void register_pools(CLI::App& app) {
  auto cmd = std::make_shared<demo_command>();
  auto* sub = app.add_subcommand(
      "pools",
      "replay a sequence-batch and random-mix workload on every allocator strategy, check "
      "data integrity, print a pool report");
  sub->add_option("--resource", cmd->options.resource,
                  "upstream resource (default: cuda with a GPU, else host)")
      ->check(CLI::IsMember(pool::resource_names()));
  sub->add_option("--device", cmd->options.device, "GPU ordinal for device resources")
      ->check(poolscope::tools::non_negative_number());
  sub->add_option("--steps", cmd->options.steps,
                  "sequence-batch steps (the random mix adds 100 pairs per step)")
      ->check(poolscope::tools::whole_number(1, 100000));
  sub->add_option("--seed", cmd->options.seed, "seed of the workload")
      ->check(poolscope::tools::non_negative_number());
  sub->add_option("--allocators", cmd->options.allocators,
                  "comma-separated strategies (default: all registered)")
      ->delimiter(',')
      ->check(CLI::IsMember(pool::allocator_names()));
  sub->add_option("--json", cmd->json_path,
                  "also write the report as JSON to this file ('-': stdout, the text then goes "
                  "to stderr)")
      ->check(path_value(true))
      ->transform(output_path_option());
  sub->add_flag("--force", cmd->force, "replace the --json file if it exists");
  sub->callback([cmd] {
    check_file_arguments("poolscope pools", {{"--json", cmd->json_path, true}}, cmd->force);
    const demo_report rep = run_demo(cmd->options, &std::cerr);
    // With the JSON on stdout, stdout holds nothing else.
    rep.print(cmd->json_path == "-" ? std::cerr : std::cout);
    if (!cmd->json_path.empty()) {
      write_output("poolscope pools", "--json", cmd->json_path, rep.to_json() + "\n");
    }
    if (!rep.integrity_ok()) {
      throw CLI::RuntimeError(1);
    }
    if (rep.any_error()) {
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace poolscope::tools
