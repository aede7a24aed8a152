// The poolscope command's output files, run as a subprocess: an output path that is an input or
// another output, that exists (without --force), or that could not be written, is refused before
// any work (paths compared after normalising them, links followed; exit code 2); the demo's
// default outputs go into a fresh folder; and `--json -` leaves only JSON on stdout, the text
// going to stderr.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_support.hpp"

#ifdef POOLSCOPE_CLI_PATH

namespace {

using nlohmann::json;
using poolscope::testing::contains;
using poolscope::testing::process_result;
using poolscope::testing::read_file;
using poolscope::testing::run_cli;
using poolscope::testing::run_process;
using poolscope::testing::small_trace_text;
using poolscope::testing::temp_path;
using poolscope::testing::write_file;

// A poolscope event log (docs/event_log.md): two blocks allocated and freed.
std::string event_log_text() {
  const auto rec = [](int seq, const char* action, const char* ptr, int size, const char* phase) {
    return R"({"seq":)" + std::to_string(seq) + R"(,"time_ns":)" + std::to_string(1000 + seq) +
           R"(,"thread":7,"device":-1,"stream":"0x0","allocator":"rec/host","allocator_id":1,)" +
           R"("action":")" + action + R"(","phase":")" + phase + R"(","ptr":")" + ptr +
           R"(","size":)" + std::to_string(size) + R"(,"rounded":)" + std::to_string(size) + "}\n";
  };
  return std::string(R"({"format":"poolscope.events","version":1,"pid":1})") + "\n" +
         rec(1, "malloc", "0x1000", 1000, "post") + rec(2, "malloc", "0x2000", 3000, "post") +
         rec(3, "free", "0x1000", 1000, "pre") + rec(4, "free", "0x2000", 3000, "pre");
}

// ---- 1. one path, two roles ----

TEST(cli_args, demo_refuses_one_file_for_trace_and_report_before_running) {
  const std::string path = temp_path("poolscope-same") + ".json";
  const process_result r = run_cli({"demo", "--devices", "host:2", "--n", "4096", "--repeat", "1",
                                    "--trace", path, "--report", path});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--report '" + path + "' is the same file as --trace")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;  // refused before the demo ran
  EXPECT_FALSE(std::filesystem::exists(path)) << "nothing written";
}

TEST(cli_args, demo_compares_paths_after_normalising_them) {
  const std::string path = temp_path("poolscope-same") + ".json";
  const std::filesystem::path p(path);
  // The same file through "dir/./name" and "dir/../dir/name".
  const std::string a = (p.parent_path() / "." / p.filename()).string();
  const std::string b =
      (p.parent_path() / ".." / p.parent_path().filename() / p.filename()).string();
  const process_result r = run_cli(
      {"demo", "--devices", "host:2", "--n", "4096", "--repeat", "1", "--trace", a, "--report", b});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "is the same file as --trace")) << r.err;
  // The report in the --out folder is an output too.
  const std::string folder = temp_path("poolscope-out");
  std::filesystem::remove(folder);
  std::filesystem::create_directory(folder);
  const std::string in_folder = folder + "/report.json";
  const process_result d = run_cli({"demo", "--devices", "host:2", "--n", "4096", "--repeat", "1",
                                    "--out", folder, "--trace", in_folder});
  EXPECT_EQ(d.exit_code, 2) << d.out << d.err;
  EXPECT_TRUE(contains(d.err, "--report '" + in_folder + "' is the same file as --trace")) << d.err;
  std::filesystem::remove_all(folder);
}

TEST(cli_args, trace_summary_refuses_to_overwrite_its_input) {
  const std::string path = write_file("poolscope-trace", small_trace_text);
  const process_result r = run_cli({"trace", "summary", path, "--json", path});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--json '" + path + "' is the input FILE")) << r.err;
  EXPECT_EQ(read_file(path), small_trace_text) << "the input is untouched";
  // A symbolic link to the input is the input.
  const std::string link = temp_path("poolscope-link");
  std::remove(link.c_str());
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  const process_result l = run_cli({"trace", "summary", path, "--json", link});
  EXPECT_EQ(l.exit_code, 2) << l.out << l.err;
  EXPECT_EQ(read_file(path), small_trace_text);
  std::remove(link.c_str());
  std::remove(path.c_str());
}

TEST(cli_args, replay_refuses_to_overwrite_its_log) {
  const std::string log = write_file("poolscope-log", event_log_text());
  const process_result r = run_cli({"replay", log, "--json", log});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--json '" + log + "' is the input LOG")) << r.err;
  EXPECT_EQ(read_file(log), event_log_text()) << "the log is untouched";
  // A hard link to the log is the log.
  const std::string hard = temp_path("poolscope-hard");
  std::remove(hard.c_str());
  ASSERT_EQ(::link(log.c_str(), hard.c_str()), 0);
  const process_result h = run_cli({"replay", log, "--json", hard});
  EXPECT_EQ(h.exit_code, 2) << h.out << h.err;
  EXPECT_EQ(read_file(log), event_log_text());
  std::remove(hard.c_str());
  std::remove(log.c_str());
}

TEST(cli_args, bench_darray_refuses_one_file_for_json_and_trace) {
  const std::string path = temp_path("poolscope-same") + ".json";
  const process_result r =
      run_cli({"bench", "darray", "--devices", "host:2", "--n", "4000", "--repeat", "1", "--only",
               "D4", "--json", path, "--trace", path});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--trace '" + path + "' is the same file as --json")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_FALSE(std::filesystem::exists(path));
  // Not a regular file: /dev/null may take every output.
  const process_result null =
      run_cli({"bench", "darray", "--devices", "host:2", "--n", "4000", "--repeat", "1", "--only",
               "D4", "--json", "/dev/null", "--trace", "/dev/null"});
  EXPECT_EQ(null.exit_code, 0) << null.out << null.err;
}

// An output that could not be written (a missing folder, a folder named as the file) is refused
// before any work, naming the option and the path, so a long run is not lost at its end.
TEST(cli_args, outputs_that_cannot_be_written_are_refused_before_running) {
  const std::string folder = temp_path("poolscope-missing-folder");
  std::filesystem::remove_all(folder);
  const std::string missing = folder + "/out.json";
  const std::string trace = temp_path("poolscope-trace") + ".json";
  std::remove(trace.c_str());
  const process_result demo = run_cli({"demo", "--devices", "host:2", "--n", "4096", "--repeat",
                                       "1", "--trace", trace, "--report", missing});
  EXPECT_EQ(demo.exit_code, 2) << demo.out << demo.err;
  EXPECT_TRUE(contains(demo.err, "poolscope demo: --report '" + missing + "': its folder '" +
                                     folder + "' does not exist"))
      << demo.err;
  EXPECT_TRUE(demo.out.empty()) << demo.out;  // refused before the demo ran
  EXPECT_FALSE(std::filesystem::exists(trace)) << "nothing written";

  const std::string log = write_file("poolscope-log", event_log_text());
  const std::string here = std::filesystem::path(log).parent_path().string();
  const process_result replay = run_cli({"replay", log, "--json", here});
  EXPECT_EQ(replay.exit_code, 2) << replay.out << replay.err;
  EXPECT_TRUE(contains(replay.err, "poolscope replay: --json '" + here + "' is a folder"))
      << replay.err;
  EXPECT_TRUE(replay.out.empty()) << replay.out;
  std::remove(log.c_str());

  // A regular file where the folder should be.
  const std::string file = write_file("poolscope-not-a-folder", "x");
  const process_result bench =
      run_cli({"bench", "darray", "--devices", "host:2", "--n", "4000", "--repeat", "1", "--only",
               "D4", "--json", file + "/out.json"});
  EXPECT_EQ(bench.exit_code, 2) << bench.out << bench.err;
  EXPECT_TRUE(contains(bench.err, "poolscope bench darray: --json '" + file + "/out.json': '" +
                                      file + "' is not a folder"))
      << bench.err;
  EXPECT_TRUE(bench.out.empty()) << bench.out;
  std::remove(file.c_str());

  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"pools", "--steps", "1", "--json", missing},
        std::vector<std::string>{"bench", "alloc", "--seconds", "0.001", "--json", missing}}) {
    const process_result r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "--json '" + missing + "': its folder")) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// ---- 2. no file replaced silently, nothing written where nobody asked ----

TEST(cli_args, an_output_that_exists_is_replaced_only_with_force) {
  const std::string log = write_file("poolscope-log", event_log_text());
  const std::string out = write_file("poolscope-json", "keep");
  const process_result r = run_cli({"replay", log, "--json", out});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "poolscope replay: --json '" + out +
                                  "' exists; give another path, or --force to replace it"))
      << r.err;
  EXPECT_EQ(read_file(out), "keep");
  const process_result f = run_cli({"replay", log, "--json", out, "--force"});
  EXPECT_EQ(f.exit_code, 0) << f.out << f.err;
  EXPECT_TRUE(nlohmann::json::parse(read_file(out)).is_object());
  std::remove(log.c_str());
  std::remove(out.c_str());
}

// A plain demo writes into a fresh folder in TMPDIR that it names, so it runs from a folder it
// cannot write and two runs never share files.
TEST(cli_args, demo_writes_into_a_fresh_folder_it_names) {
  const std::string tmp = temp_path("poolscope-tmp");
  std::filesystem::remove(tmp);
  std::filesystem::create_directory(tmp);
  const std::string locked = tmp + "/locked";
  std::filesystem::create_directory(locked);
  std::filesystem::permissions(
      locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  const std::string cmd = "cd '" + locked + "' && exec '" + std::string(POOLSCOPE_CLI_PATH) +
                          "' demo --devices host:2 --n 4096 --repeat 1 --no-cupti";
  std::vector<std::string> folders;
  for (int run = 0; run < 2; ++run) {
    const process_result r =
        run_process({"/bin/sh", "-c", cmd}, {{"TMPDIR", tmp}, {"POOLSCOPE_LOG", "warn"}});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    std::string found;
    for (const auto& e : std::filesystem::directory_iterator(tmp)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with("poolscope-demo-") &&
          std::find(folders.begin(), folders.end(), e.path().string()) == folders.end()) {
        found = e.path().string();
      }
    }
    ASSERT_FALSE(found.empty()) << "no new poolscope-demo-* folder in " << tmp;
    EXPECT_TRUE(contains(r.out, found + "/trace.json")) << r.out;
    EXPECT_TRUE(std::filesystem::exists(found + "/trace.json"));
    EXPECT_TRUE(std::filesystem::exists(found + "/report.json"));
    folders.push_back(found);
  }
  EXPECT_NE(folders[0], folders[1]);
  std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  std::filesystem::remove_all(tmp);
}

// An option that takes a path never takes the next option as its path.
TEST(cli_args, a_path_option_does_not_swallow_the_next_option) {
  const process_result r = run_cli({"replay", "x.jsonl", "--json", "--force"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "poolscope replay: ")) << r.err;
  EXPECT_TRUE(contains(r.err, "needs a path, not '--force'")) << r.err;
  EXPECT_FALSE(std::filesystem::exists("--force"));
  // The demo's --trace and --report alone mean "the default place": both into the fresh folder.
  const std::string tmp = temp_path("poolscope-tmp");
  std::filesystem::remove(tmp);
  std::filesystem::create_directory(tmp);
  const process_result d =
      run_process({POOLSCOPE_CLI_PATH, "demo", "--devices", "host:2", "--n", "4096", "--repeat",
                   "1", "--no-cupti", "--trace", "--report"},
                  {{"TMPDIR", tmp}, {"POOLSCOPE_LOG", "warn"}});
  EXPECT_EQ(d.exit_code, 0) << d.out << d.err;
  EXPECT_FALSE(std::filesystem::exists("--report"));
  EXPECT_TRUE(contains(d.out, tmp + "/poolscope-demo-")) << d.out;
  std::filesystem::remove_all(tmp);
}

// ---- 3. --json - : stdout holds the JSON alone, the text goes to stderr ----

TEST(cli_args, json_to_stdout_is_pure_json) {
  const std::string trace = write_file("poolscope-trace", small_trace_text);
  const std::string log = write_file("poolscope-log", event_log_text());
  const std::vector<std::vector<std::string>> commands{
      {"trace", "summary", trace, "--json", "-"},
      {"trace", "summary", trace, "--range", "phase", "--json", "-"},
      {"replay", log, "--allocators", "naive,bfc", "--json", "-"},
      {"pools", "--resource", "host", "--steps", "1", "--allocators", "bfc", "--json", "-"},
      {"bench", "darray", "--devices", "host:2", "--n", "4000", "--repeat", "1", "--only", "D4",
       "--json", "-"},
      {"bench", "alloc", "--resource", "host", "--quick", "--workloads", "A1", "--allocators",
       "bfc", "--json", "-"}};
  for (const auto& args : commands) {
    SCOPED_TRACE(args[0] + " " + args[1]);
    const process_result r = run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << "stdout is not one JSON document:\n" << r.out;
    EXPECT_TRUE(j.is_object());
    EXPECT_FALSE(r.err.empty()) << "the text goes to stderr";
  }
  std::remove(trace.c_str());
  std::remove(log.c_str());
}

}  // namespace

#endif  // POOLSCOPE_CLI_PATH
