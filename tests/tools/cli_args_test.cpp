// The poolscope command's checks of its arguments, run as a subprocess: sizes whose host memory
// cannot be had are refused at once, naming the option, and running out of host memory names the
// command; negative values of unsigned options are refused; unknown commands and bad --devices
// specs are named with what is wrong. Every refusal exits nonzero with a message naming the
// option and the value.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "host_memory.hpp"

#ifdef POOLSCOPE_CLI_PATH

namespace {

using poolscope::testing::contains;
using poolscope::testing::process_result;
using poolscope::testing::run_cli;
using poolscope::testing::run_process;
using poolscope::testing::small_trace_text;
using poolscope::testing::temp_path;
using poolscope::testing::write_file;

// ---- 3. sizes that cannot fit in host memory ----

// The host memory the CLI's size checks compare against (tools/src/host_memory.hpp), 0 if
// unknown. The demo's largest sizes fit a host with enough of it (704 GiB for its largest --n):
// there, as where the figure is unknown, the refusals are not to be expected.
std::uint64_t cli_host_memory() {
  return poolscope::tools::host_memory_available().bytes;
}

constexpr std::uint64_t gib = std::uint64_t{1} << 30;

TEST(cli_args, demo_refuses_sizes_that_cannot_fit_in_host_memory) {
  // 2^34 floats (the largest --n): 3 x 64 GiB of input vectors alone, 704 GiB with host devices.
  if (const std::uint64_t avail = cli_host_memory(); avail == 0 || avail >= 704 * gib) {
    GTEST_SKIP() << "the CLI counts on " << avail / gib
                 << " GiB of host memory (0: unknown), so it does not refuse the largest --n";
  }
  const process_result r =
      run_cli({"demo", "--devices", "host:2", "--n", "17179869184", "--repeat", "1"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "poolscope demo: --n 17179869184")) << r.err;
  EXPECT_TRUE(contains(r.err, "of host memory, but")) << r.err;
  EXPECT_TRUE(contains(r.err, "is available")) << r.err;
  EXPECT_FALSE(contains(r.err, "bad_alloc")) << r.err;
  // A 65536^2 matmul (the largest) on 64 host devices: the product is replicated on each (1.11
  // TiB).
  if (const std::uint64_t avail = cli_host_memory(); avail == 0 || avail >= 1137 * gib) {
    GTEST_SKIP() << "the CLI counts on " << avail / gib
                 << " GiB of host memory (0: unknown), so it does not refuse the largest matmul";
  }
  const process_result m =
      run_cli({"demo", "--devices", "host:64", "--matmul-n", "65536", "--repeat", "1"});
  EXPECT_EQ(m.exit_code, 1) << m.out << m.err;
  EXPECT_TRUE(contains(m.err, "poolscope demo: --matmul-n 65536")) << m.err;
}

TEST(cli_args, bench_darray_refuses_sizes_that_cannot_fit_on_host_devices) {
  // 2^40 floats: 16 TiB for D1's vectors. (2^34, 256 GiB, fitted the 512 GiB of a 4-GPU host,
  // where the bench then ran D1 on host devices until the test's timeout.)
  const process_result r = run_cli({"bench", "darray", "--devices", "host:2", "--n",
                                    "1099511627776", "--repeat", "1", "--only", "D1"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "poolscope bench darray: --n 1099511627776")) << r.err;
  EXPECT_TRUE(contains(r.err, "of host memory")) << r.err;
  const process_result m = run_cli({"bench", "darray", "--devices", "host:64", "--matmul-n",
                                    "1000000", "--repeat", "1", "--only", "D5"});
  EXPECT_EQ(m.exit_code, 1) << m.out << m.err;
  EXPECT_TRUE(contains(m.err, "poolscope bench darray: --matmul-n 1000000")) << m.err;
}

TEST(cli_args, running_out_of_host_memory_names_the_command) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The CLI of a sanitizer build maps its shadow memory at start: under ulimit -v it cannot.
  GTEST_SKIP() << "a sanitizer build's CLI cannot start under an address-space limit";
#endif
  // Under a 1 GiB address-space limit the demo's 3 x 256 MiB vectors and its arrays cannot all
  // be had, though the machine has the memory: std::bad_alloc, reported with the command's name.
  const std::string cmd = "ulimit -v 1048576 && exec " + std::string(POOLSCOPE_CLI_PATH) +
                          " demo --devices host:2 --n 67108864 --repeat 1 --trace /dev/null "
                          "--report /dev/null";
  const process_result r = run_process({"/bin/sh", "-c", cmd}, {{"POOLSCOPE_LOG", "warn"}});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "poolscope demo: out of host memory")) << r.err;
}

// ---- 5. negative values of unsigned options ----

// Runs the CLI with `args`, whose last two are an option and its bad value, and expects a
// refusal whose message names the option and holds `what`.
process_result run_refused(const std::vector<std::string>& args, const std::string& what) {
  process_result r = run_cli(args);
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, args[args.size() - 2])) << r.err;
  EXPECT_TRUE(contains(r.err, what)) << r.err;
  return r;
}

TEST(cli_args, negative_values_of_unsigned_options_are_refused) {
  const std::string trace = write_file("poolscope-trace", small_trace_text);
  const std::vector<std::vector<std::string>> commands{
      {"pools", "--resource", "host", "--steps", "1", "--seed", "-5"},
      {"demo", "--devices", "host:2", "--n", "4096", "--seed", "-1"},
      {"trace", "summary", trace, "--top", "-1"},
      {"trace", "check", trace, "--max-issues", "-1"},
      {"bench", "alloc", "--quick", "--seed", "-1"},
      {"pools", "--steps", "-1"}};
  for (const auto& args : commands) {
    SCOPED_TRACE(args[0] + " " + args[args.size() - 2] + " " + args.back());
    const process_result r = run_refused(args, args.back());
    EXPECT_FALSE(contains(r.out, "18446744073709551")) << r.out;
  }
  std::remove(trace.c_str());
}

// On/off options take 1 or 0 (or true/false, on/off, yes/no): CLI11 alone reads any other whole
// number as on.
TEST(cli_args, on_off_options_refuse_other_numbers) {
  const std::vector<std::vector<std::string>> commands{
      {"demo", "--devices", "host:2", "--n", "4096", "--kernel-graphs", "7"},
      {"demo", "--devices", "host:2", "--n", "4096", "--yield-to-copies", "-1"},
      {"bench", "darray", "--devices", "host:2", "--only", "D4", "--kernel-graphs", "2"},
      {"bench", "darray", "--devices", "host:2", "--only", "D4", "--yield-to-copies", "maybe"}};
  for (const auto& args : commands) {
    SCOPED_TRACE(args[0] + " " + args[args.size() - 2] + " " + args.back());
    const process_result r = run_refused(args, "not '" + args.back() + "'");
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  const std::string trace = temp_path("poolscope-on-off") + ".trace.json";
  const std::string report = temp_path("poolscope-on-off") + ".report.json";
  const process_result ok =
      run_cli({"demo", "--devices", "host:2", "--n", "4096", "--repeat", "1", "--kernel-graphs",
               "0", "--yield-to-copies", "off", "--trace", trace, "--report", report});
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  std::remove(trace.c_str());
  std::remove(report.c_str());
}

// ---- 17-19. unknown commands, bad --devices ----

TEST(cli_args, an_unknown_command_is_named) {
  const process_result r = run_cli({"foo"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "poolscope: unknown command 'foo'")) << r.err;
  EXPECT_TRUE(contains(r.err, "demo, pools, bench, replay, snapshot, report, trace")) << r.err;
  const process_result b = run_cli({"bench", "speed"});
  EXPECT_NE(b.exit_code, 0);
  EXPECT_TRUE(contains(b.err, "poolscope bench: unknown command 'speed'")) << b.err;
  // A command's own arguments are its own: `replay LOG` is not an unknown command.
  const process_result l = run_cli({"replay", "/nonexistent-poolscope-dir/log.jsonl"});
  EXPECT_NE(l.exit_code, 0);
  EXPECT_FALSE(contains(l.err, "unknown command")) << l.err;
}

TEST(cli_args, a_bad_devices_spec_says_what_is_wrong) {
  for (const char* cmd : {"demo", "bench darray"}) {
    SCOPED_TRACE(cmd);
    std::vector<std::string> head{cmd};
    if (std::string(cmd) == "bench darray") {
      head = {"bench", "darray"};
    }
    auto with = [&head](const std::string& spec) {
      std::vector<std::string> args = head;
      args.insert(args.end(), {"--devices", spec});
      return run_cli(args);
    };
    const process_result abc = with("host:abc");
    EXPECT_NE(abc.exit_code, 0);
    EXPECT_TRUE(contains(abc.err, "--devices")) << abc.err;
    EXPECT_TRUE(contains(abc.err, "'host:abc': the device count 'abc' is not a whole number"))
        << abc.err;
    const process_result zero = with("cuda:0");
    EXPECT_NE(zero.exit_code, 0);
    EXPECT_TRUE(contains(zero.err, "'cuda:0': the device count 0 is outside 1..64")) << zero.err;
    EXPECT_TRUE(contains(zero.err, "cuda:N: the first N GPUs")) << zero.err;
    const process_result gpu = with("gpu");
    EXPECT_NE(gpu.exit_code, 0);
    EXPECT_TRUE(contains(gpu.err, "'gpu': expected host:N, cuda, cuda:N or auto")) << gpu.err;
  }
}

}  // namespace

#endif  // POOLSCOPE_CLI_PATH
