// poolscope::darray on the NCCL communicator of a PyTorch program. torchrun starts the ranks (no
// MPI); each makes c10d's ProcessGroupNCCL over torchrun's TCP store, all-reduces a tensor through
// it (which makes its communicator on the rank's GPU) and hands that communicator to
// process_group::adopt_nccl. The seed example, A + C.reshard(A.index_map()), then runs across the
// ranks on it, one GPU each, and every value and the sum are checked against the host. PyTorch
// all-reduces through the same communicator once more afterwards: it stays PyTorch's. Exits 1 on
// any mismatch or error, on the rank that saw it.
//
//   torchrun --no-python --nproc-per-node 2 build-examples/torch_adopt
//
// Built where CMake finds libtorch (examples/CMakeLists.txt). poolscope and PyTorch must share one
// libnccl.so.2 in the process: the first loaded serves both (the dynamic linker matches the
// soname), so the communicator crosses no library boundary.
#include <poolscope/darray/backend.hpp>
#include <poolscope/darray/distributed_array.hpp>
#include <poolscope/darray/process_group.hpp>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    throw std::runtime_error(std::string(name) + " is not set: start this program with torchrun");
  }
  return std::stoi(v);
}

// PyTorch's all-reduce of `rank + 1` on every rank: size (size + 1) / 2 when its communicator
// works.
void check_torch_all_reduce(c10d::ProcessGroupNCCL& pg, int rank, int size, const char* when) {
  std::vector<at::Tensor> t{at::full({1}, rank + 1, at::device(at::kCUDA).dtype(at::kLong))};
  pg.allreduce(t)->wait();
  const std::int64_t got = t[0].item<std::int64_t>();
  if (got != std::int64_t{size} * (size + 1) / 2) {
    throw std::runtime_error(std::string("PyTorch's all-reduce ") + when + " gave " +
                             std::to_string(got) + ", expected " +
                             std::to_string(std::int64_t{size} * (size + 1) / 2));
  }
}

// The seed example on `be`'s GPUs (one per rank), checked against the host; returns the sum.
std::int64_t seed_example(const std::shared_ptr<poolscope::darray::backend>& be) {
  using namespace poolscope::darray;
  const int devices = be->device_count();
  const std::int64_t n = (std::int64_t{1} << 22) * devices + 3;
  std::vector<std::int64_t> a_host(static_cast<std::size_t>(n));
  std::vector<std::int64_t> c_host(a_host.size());
  std::iota(a_host.begin(), a_host.end(), 0);
  std::iota(c_host.begin(), c_host.end(), 1000000000);
  // C's inner boundaries at (k + 0.4) blocks: every rank sends to its neighbour and receives.
  std::vector<std::tuple<int, std::int64_t, std::int64_t>> cuts;
  const auto boundary = [&](std::int64_t k) {
    return k == 0 ? 0 : k == devices ? n : (10 * k + 4) * n / (10 * devices);
  };
  for (int k = 0; k < devices; ++k) {
    cuts.emplace_back(k, boundary(k), boundary(k + 1));
  }
  const auto a_map = index_map::blocks({n}, 0, devices);
  const auto a = distributed_array<std::int64_t>::from_host(be, a_host, {n}, a_map);
  const auto c =
      distributed_array<std::int64_t>::from_host(be, c_host, {n}, index_map::split({n}, 0, cuts));
  const auto d = a + c.reshard(a_map);
  const std::vector<std::int64_t> out = d.to_host();
  std::int64_t want_total = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t want = a_host[i] + c_host[i];
    want_total += want;
    if (out[i] != want) {
      throw std::runtime_error("element " + std::to_string(i) + " is " + std::to_string(out[i]) +
                               ", expected " + std::to_string(want));
    }
  }
  const std::int64_t total = sum(d).change_mode(array_mode::replica).to_host()[0];
  if (total != want_total) {
    throw std::runtime_error("the sum is " + std::to_string(total) + ", expected " +
                             std::to_string(want_total));
  }
  if (be->stats().bytes_between_ranks == 0) {
    throw std::runtime_error("no byte crossed ranks through the adopted communicator");
  }
  return total;
}

}  // namespace

int main() {
  int rank = -1;
  try {
    rank = env_int("RANK");
    const int size = env_int("WORLD_SIZE");
    const int local_rank = env_int("LOCAL_RANK");
    const char* host = std::getenv("MASTER_ADDR");
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(local_rank));
    // torchrun's agent serves the store (TORCHELASTIC_USE_AGENT_STORE); without it, rank 0 does.
    const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(env_int("MASTER_PORT"));
    store_options.isServer = rank == 0 && (agent == nullptr || std::string(agent) != "True");
    store_options.numWorkers = size;
    auto store = c10::make_intrusive<c10d::PrefixStore>(
        "poolscope_torch_adopt",
        c10::make_intrusive<c10d::TCPStore>(host != nullptr ? host : "127.0.0.1", store_options));
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size);
    check_torch_all_reduce(*pg, rank, size, "before");
    void* comm = reinterpret_cast<void*>(pg->getCommPtr());
    if (comm == nullptr) {
      throw std::runtime_error("ProcessGroupNCCL has no communicator on GPU " +
                               std::to_string(local_rank));
    }
    std::int64_t total = 0;
    std::string name;
    {
      poolscope::darray::backend_options o;
      o.group = poolscope::darray::process_group::adopt_nccl(comm, rank, size);
      const auto be = poolscope::darray::make_cuda_backend(1, o);
      total = seed_example(be);
      name = be->name();
      be->synchronize();
    }
    check_torch_all_reduce(*pg, rank, size, "after");
    pg->shutdown();
    if (rank == 0) {
      std::printf(
          "torch_adopt: %d ranks on %s, through PyTorch's NCCL communicator: A + "
          "C.reshard(A.index_map()) checked, sum %lld\n",
          size, name.c_str(), static_cast<long long>(total));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_adopt (rank %d): %s\n", rank, e.what());
    return 1;
  }
}
