// The timeline with CUPTI on a GPU: kernels on two streams, host<->device copies, a memset, an
// NVTX range and pool activity, inside host scopes. The trace must hold the kernels, copies and
// memset, a flow from each launch to its device operation, each kernel inside the time span of
// the host scope that launched it (one clock), the NVTX range as CUPTI saw it, pool counters and
// CUDA allocations; it must pass the checker, and its summary must see compute and transfer.
//
// The workload runs in a child process of this test (cupti_gpu.workload_child) started with
// NVTX_INJECTION64_PATH naming libcupti: NVTX picks its tool once per process, on its first
// call, and nvtx_test.cpp (same executable) names its own injection library for the parent.
// Without a GPU both tests skip.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <nvtx3/nvToolsExt.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "poolscope/analysis/trace_summary.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/cuda_resource.hpp"
#include "poolscope/profiler/report.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "trace_test_util.hpp"

extern char** environ;

namespace {

using nlohmann::json;
using poolscope::profiler::testing::events_of;
using poolscope::profiler::testing::to_ns;

constexpr const char* child_variable = "POOLSCOPE_CUPTI_GPU_CHILD_TRACE";
constexpr int n = 1 << 20;
constexpr std::size_t bytes = sizeof(float) * n;

__global__ void scale(float* p, int count, float f) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) {
    p[i] = p[i] * f + 1.0F;
  }
}

__global__ void add_one(float* p, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) {
    p[i] += 1.0F;
  }
}

bool have_gpu() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

#define CHECK_CUDA(call)                                                                     \
  do {                                                                                       \
    const cudaError_t check_status = (call);                                                 \
    ASSERT_EQ(check_status, cudaSuccess) << #call << ": " << cudaGetErrorName(check_status); \
  } while (false)

// What the child does; the host scopes are added as the function profiler would add them.
void run_workload(const std::string& trace_path) {
  poolscope::profiler::timeline_options o;
  o.trace_path = trace_path;
  poolscope::profiler::timeline tl(o);
  tl.start();
  ASSERT_EQ(tl.cupti().state, poolscope::profiler::cupti_state::running) << tl.cupti().reason;
  {
    poolscope::pool::cuda_resource res(0);
    poolscope::pool::bfc_allocator pool(res);
    cudaStream_t s1 = nullptr;
    cudaStream_t s2 = nullptr;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    float* host = nullptr;
    CHECK_CUDA(cudaMallocHost(&host, bytes));
    for (int i = 0; i < n; ++i) {
      host[i] = 1.0F;
    }
    const int blocks = (n + 255) / 256;
    const auto scope = [&tl](const char* name, std::uint64_t t0) {
      tl.add_host_slice({.name = name, .begin_ns = t0, .end_ns = poolscope::hooks::now_ns()});
    };

    std::uint64_t t0 = poolscope::hooks::now_ns();
    auto* a = static_cast<float*>(pool.allocate(s1, bytes));
    CHECK_CUDA(cudaMemcpyAsync(a, host, bytes, cudaMemcpyHostToDevice, s1));
    scale<<<blocks, 256, 0, s1>>>(a, n, 2.0F);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaStreamSynchronize(s1));
    scope("upload and scale", t0);

    t0 = poolscope::hooks::now_ns();
    auto* b = static_cast<float*>(pool.allocate(s2, bytes));
    CHECK_CUDA(cudaMemsetAsync(b, 0, bytes, s2));
    add_one<<<blocks, 256, 0, s2>>>(b, n);
    scale<<<blocks, 256, 0, s2>>>(b, n, 3.0F);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpyAsync(host, b, bytes, cudaMemcpyDeviceToHost, s2));
    CHECK_CUDA(cudaStreamSynchronize(s2));
    scope("memset, two kernels and a download", t0);
    EXPECT_EQ(host[0], 4.0F);  // (0 + 1) * 3 + 1

    t0 = poolscope::hooks::now_ns();
    nvtxRangePushA("poolscope gpu test range");
    add_one<<<blocks, 256, 0, s1>>>(a, n);
    CHECK_CUDA(cudaStreamSynchronize(s1));
    nvtxRangePop();
    scope("nvtx", t0);

    pool.deallocate(s1, a, bytes);
    pool.deallocate(s2, b, bytes);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaFreeHost(host));
    CHECK_CUDA(cudaStreamDestroy(s1));
    CHECK_CUDA(cudaStreamDestroy(s2));
  }
  tl.stop();
  auto report = poolscope::profiler::run_report::from(tl);
  report.write(trace_path + ".report.json");
}

TEST(cupti_gpu, workload_child) {
  const char* path = std::getenv(child_variable);
  if (path == nullptr) {
    GTEST_SKIP() << "runs only as the child process of cupti_gpu.trace_of_a_workload";
  }
  run_workload(path);
}

// Runs the workload in a child with NVTX_INJECTION64_PATH=libcupti; returns its exit status.
int run_child(const std::string& trace_path, std::string& output) {
  const std::string lib = poolscope::profiler::cupti_collector::library_path();
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    if (kv.rfind("NVTX_INJECTION64_PATH=", 0) != 0 && kv.rfind(child_variable, 0) != 0) {
      env.push_back(kv);
    }
  }
  env.push_back("NVTX_INJECTION64_PATH=" + lib);
  env.push_back(std::string(child_variable) + "=" + trace_path);
  std::vector<char*> envp;
  for (auto& s : env) {
    envp.push_back(s.data());
  }
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  std::string filter = "--gtest_filter=cupti_gpu.workload_child";
  char* argv[] = {self.data(), filter.data(), nullptr};
  const std::string out_path = trace_path + ".out";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    output = "posix_spawn failed: " + std::to_string(rc);
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  output = poolscope::profiler::testing::read_bytes(out_path);
  std::remove(out_path.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

struct slice {
  long long begin = 0;
  long long end = 0;
  json event;
};

slice slice_of(const json& e) {
  const long long b = to_ns(e["ts"]);
  return {b, b + to_ns(e["dur"]), e};
}

TEST(cupti_gpu, trace_of_a_workload) {
  if (!have_gpu()) {
    GTEST_SKIP() << "no CUDA GPU";
  }
  poolscope::profiler::testing::temp_file trace(".json");
  const std::string report_path = trace.path() + ".report.json";
  std::string output;
  const int status = run_child(trace.path(), output);
  ASSERT_EQ(status, 0) << output;
  ASSERT_NE(output.find("[  PASSED  ] 1 test"), std::string::npos) << output;

  poolscope::profiler::testing::expect_valid_trace(trace.path());
  poolscope::analysis::trace_read_info info;
  const auto events = poolscope::profiler::testing::read_events(trace.path(), &info);
  const json& cupti = info.other["otherData"]["cupti"];
  EXPECT_GT(cupti["records"].get<std::uint64_t>(), 0U) << cupti;
  EXPECT_EQ(cupti["dropped_records"], 0) << cupti;
  EXPECT_EQ(cupti["buffers_refused"], 0) << cupti;

  const std::int64_t gpu = poolscope::profiler::device_pid(0);
  // Host scopes, on one thread.
  std::vector<slice> scopes;
  for (const auto& e : events_of(events, "X", "user")) {
    scopes.push_back(slice_of(e));
  }
  ASSERT_EQ(scopes.size(), 3U);
  const auto host_tid = scopes[0].event["tid"].get<std::uint64_t>();

  // Kernels: four, on two streams, names demangled.
  const auto kernels = events_of(events, "X", "kernel");
  ASSERT_EQ(kernels.size(), 4U);
  std::set<std::int64_t> streams;
  std::map<std::string, int> kernel_names;
  for (const auto& k : kernels) {
    EXPECT_EQ(k["pid"], gpu);
    streams.insert(k["tid"].get<std::int64_t>());
    ++kernel_names[k["name"].get<std::string>()];
  }
  EXPECT_EQ(streams.size(), 2U);
  // Demangled as written: the kernels live in this file's anonymous namespace.
  EXPECT_EQ(kernel_names["(anonymous namespace)::scale(float*, int, float)"], 2)
      << json(kernel_names);
  EXPECT_EQ(kernel_names["(anonymous namespace)::add_one(float*, int)"], 2) << json(kernel_names);
  EXPECT_EQ(kernel_names.size(), 2U) << json(kernel_names);
  // Copies and the memset, with their bytes.
  const auto copies = events_of(events, "X", "memcpy");
  ASSERT_EQ(copies.size(), 2U);
  std::set<std::string> copy_names;
  for (const auto& c : copies) {
    copy_names.insert(c["name"].get<std::string>());
    EXPECT_EQ(c["args"]["bytes"], bytes);
    EXPECT_GT(c["args"]["gbps"].get<double>(), 0.0);
  }
  EXPECT_EQ(copy_names, (std::set<std::string>{"Memcpy HtoD", "Memcpy DtoH"}));
  const auto memsets = events_of(events, "X", "memset");
  ASSERT_EQ(memsets.size(), 1U);
  EXPECT_EQ(memsets[0]["args"]["bytes"], bytes);

  // Flows: each device operation has one, from a CUDA API call on the host thread.
  std::map<std::uint64_t, json> starts;
  for (const auto& s : events_of(events, "s", "launch")) {
    starts[s["id"].get<std::uint64_t>()] = s;
  }
  std::vector<json> ops = kernels;
  ops.insert(ops.end(), copies.begin(), copies.end());
  ops.insert(ops.end(), memsets.begin(), memsets.end());
  const auto ends = events_of(events, "f", "launch");
  const auto api = events_of(events, "X", "cuda_api");
  for (const auto& op : ops) {
    const slice o = slice_of(op);
    const json* end = nullptr;
    for (const auto& f : ends) {
      if (f["pid"] == op["pid"] && f["tid"] == op["tid"] && to_ns(f["ts"]) == o.begin) {
        end = &f;
      }
    }
    ASSERT_NE(end, nullptr) << "no flow ends at " << op;
    const auto s = starts.find((*end)["id"].get<std::uint64_t>());
    ASSERT_NE(s, starts.end()) << "no flow start for " << *end;
    EXPECT_EQ(s->second["tid"].get<std::uint64_t>(), host_tid) << "launch not on the host thread";
    // The flow starts at a CUDA API call on that thread...
    const long long launch_ts = to_ns(s->second["ts"]);
    bool at_call = false;
    for (const auto& c : api) {
      if (c["tid"].get<std::uint64_t>() == host_tid && to_ns(c["ts"]) == launch_ts) {
        at_call = true;
      }
    }
    EXPECT_TRUE(at_call) << "flow start " << s->second << " is not at an API call";
    // ...inside a host scope, and the operation ran inside that same scope's span.
    if (op["cat"] == "kernel") {
      const slice* owner = nullptr;
      for (const slice& sc : scopes) {
        if (sc.begin <= launch_ts && launch_ts <= sc.end) {
          owner = &sc;
        }
      }
      ASSERT_NE(owner, nullptr) << "launch at " << launch_ts << " outside every scope";
      EXPECT_LE(owner->begin, o.begin) << op << " starts before its scope " << owner->event;
      EXPECT_LE(o.end, owner->end) << op << " ends after its scope " << owner->event;
    }
  }

  // The NVTX range, as CUPTI saw it, around the last kernel.
  const auto ranges = events_of(events, "b", "nvtx");
  ASSERT_EQ(ranges.size(), 1U) << "no NVTX range (was libcupti the NVTX tool?)";
  EXPECT_EQ(ranges[0]["name"], "poolscope gpu test range");
  EXPECT_EQ(ranges[0]["tid"].get<std::uint64_t>(), host_tid);
  // Pool counters on the GPU's process; CUDA allocations (MEMORY2) on its memory track.
  bool pool_counter = false;
  for (const auto& c : events_of(events, "C")) {
    pool_counter |= c["pid"] == gpu && c["name"].get<std::string>().rfind("memory bfc/", 0) == 0;
  }
  EXPECT_TRUE(pool_counter);
  EXPECT_FALSE(events_of(events, "i", "allocator").empty());
  EXPECT_FALSE(events_of(events, "i", "cuda_memory").empty());
  EXPECT_FALSE(events_of(events, "b", "sync").empty());

  // The summary sees compute and transfer on device 0.
  const auto summary = poolscope::analysis::summarize_trace(trace.path());
  ASSERT_FALSE(summary.devices.empty());
  EXPECT_EQ(summary.devices[0].device, 0);
  EXPECT_GT(summary.devices[0].compute_ns, 0U);
  EXPECT_GT(summary.devices[0].transfer_ns, 0U);
  EXPECT_EQ(summary.devices[0].compute_ops, 4U);
  EXPECT_EQ(summary.devices[0].transfer_ops, 2U);
  std::printf("%s", summary.to_text(5).c_str());
  // The report the child wrote.
  std::ifstream rf(report_path);
  const json report = json::parse(rf);
  std::remove(report_path.c_str());
  EXPECT_EQ(report["run"]["cupti"]["clock"], "callback");
  EXPECT_EQ(report["run"]["cupti"]["nvtx_attached"], true);
  EXPECT_EQ(report["run"]["cupti"]["unmapped_threads"], 0) << report["run"]["cupti"];
  EXPECT_FALSE(report["run"]["devices"].empty());
  ASSERT_FALSE(report["overlap"].empty());
  EXPECT_EQ(report["kernels"].size(), 2U);  // two names
  EXPECT_EQ(report["run"]["timeline"]["events_dropped"], 0);
}

}  // namespace
