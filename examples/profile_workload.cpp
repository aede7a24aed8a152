// An allocator workload on bfc (over the cuda resource with a GPU, else host memory) under the
// line profiler and the function profiler, with POOLSCOPE_SCOPE scopes; writes the line profile
// as text, JSON and folded stacks, and the function profile as a table and JSON.
//
//   profile_workload [OUT_DIR]     (default: the current directory)
#include <poolscope/hooks/hook.hpp>
#include <poolscope/pool/factory.hpp>
#include <poolscope/profiler/function_profiler.hpp>
#include <poolscope/profiler/line_profiler.hpp>
#include <poolscope/profiler/scope.hpp>

#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {

using poolscope::pool::allocator;

std::vector<void*> load_weights(allocator& a) {
  POOLSCOPE_SCOPE("load_weights");
  std::vector<void*> w;
  for (int i = 0; i < 8; ++i) {
    w.push_back(a.allocate({}, std::size_t{1} << 20));  // 8 x 1 MiB
  }
  return w;
}

void step(allocator& a, int i) {
  POOLSCOPE_SCOPE("step");
  std::vector<std::pair<void*, std::size_t>> act;
  {
    POOLSCOPE_SCOPE("forward");
    for (int k = 0; k < 16; ++k) {
      const std::size_t n = std::size_t{4096} * static_cast<std::size_t>(1 + (k + i) % 7);
      act.emplace_back(a.allocate({}, n), n);
    }
  }
  {
    POOLSCOPE_SCOPE("backward");
    for (auto it = act.rbegin(); it != act.rend(); ++it) {
      a.deallocate({}, it->first, it->second);
    }
  }
}

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) {
    throw std::runtime_error("cannot write " + path);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string dir = argc > 1 ? argv[1] : ".";
    std::unique_ptr<poolscope::pool::resource> res;
    try {
      res = poolscope::pool::make_resource("cuda");
    } catch (const std::exception&) {
      res = poolscope::pool::make_resource("host");  // no GPU: the same code on host memory
    }
    auto pool = poolscope::pool::make_allocator("bfc", *res);

    poolscope::profiler::line_profiler lines;
    poolscope::profiler::function_profiler scopes;
    {
      poolscope::hooks::scoped_hook on{lines};
      auto weights = load_weights(*pool);
      for (int i = 0; i < 10; ++i) {
        step(*pool, i);
      }
      for (void* p : weights) {
        pool->deallocate({}, p, std::size_t{1} << 20);
      }
    }
    scopes.stop();

    const auto lp = lines.report();
    const auto fp = scopes.report();
    std::cout << "resource: " << pool->name() << "\n\nline profile (>= 64 KiB):\n"
              << lp.to_text({.threshold_bytes = 64 << 10}) << "\nfunction profile:\n"
              << fp.to_table();
    write(dir + "/alloc.txt", lp.to_text());
    write(dir + "/alloc.json", lp.to_json());
    write(dir + "/alloc.folded", lp.to_folded());
    write(dir + "/scopes.json", fp.to_json());
    std::cout << "\nwrote alloc.txt, alloc.json, alloc.folded, scopes.json in " << dir << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "profile_workload: %s\n", e.what());
    return 1;
  }
}
