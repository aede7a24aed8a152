// ipc_links (ipc_links.hpp).
#include "ipc_links.hpp"

#include <array>
#include <cstring>
#include <utility>

#include "poolscope/error.hpp"

namespace poolscope::darray::detail {

namespace {
using seam::device_guard;
using seam::log_failure;

using write_value_fn = decltype(&cuStreamWriteValue32);
using wait_value_fn = decltype(&cuStreamWaitValue32);
using pointer_attributes_fn = decltype(&cuPointerGetAttributes);

write_value_fn write_value() {
  static const auto fn = seam::driver_function<write_value_fn>("cuStreamWriteValue32", 12000);
  return fn;
}
wait_value_fn wait_value() {
  static const auto fn = seam::driver_function<wait_value_fn>("cuStreamWaitValue32", 12000);
  return fn;
}
pointer_attributes_fn pointer_attributes() {
  static const auto fn =
      seam::driver_function<pointer_attributes_fn>("cuPointerGetAttributes", 7000);
  return fn;
}

CUdeviceptr address(const void* p) noexcept {
  return reinterpret_cast<CUdeviceptr>(p);
}

std::string hex_of(const void* data, std::size_t bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text;
  for (std::size_t i = 0; i < bytes; ++i) {
    const auto b = static_cast<const unsigned char*>(data)[i];
    text += digits[b >> 4];
    text += digits[b & 15];
  }
  return text;
}

// The handles of a rank's word arrays, as hex_of wrote them, one per GPU.
std::vector<cudaIpcMemHandle_t> handles_of(const std::string& text, std::size_t gpus) {
  constexpr std::size_t width = 2 * sizeof(cudaIpcMemHandle_t);
  if (text.size() != gpus * width) {
    throw communication_error("darray cuda backend: a rank's IPC handles read " +
                              std::to_string(text.size()) + " characters (expected " +
                              std::to_string(gpus * width) + ")");
  }
  const auto nibble = [&text](std::size_t at) {
    const char c = text[at];
    if (c >= '0' && c <= '9') {
      return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
      return c - 'a' + 10;
    }
    throw communication_error("darray cuda backend: a rank's IPC handles hold '" +
                              std::string(1, c) + "' (expected hex)");
  };
  std::vector<cudaIpcMemHandle_t> out(gpus);
  for (std::size_t g = 0; g < gpus; ++g) {
    auto* bytes = reinterpret_cast<unsigned char*>(&out[g]);
    for (std::size_t i = 0; i < sizeof(cudaIpcMemHandle_t); ++i) {
      const std::size_t at = g * width + 2 * i;
      bytes[i] = static_cast<unsigned char>(nibble(at) * 16 + nibble(at + 1));
    }
  }
  return out;
}

// Whether this process can do its part of a link between its GPU `ordinal` and the GPU of `uuid`:
// it sees that GPU, and it is the same one or peer access reaches it.
bool reaches(int ordinal, const std::string& uuid, const std::vector<std::string>& visible) {
  for (std::size_t o = 0; o < visible.size(); ++o) {
    if (visible[o] != uuid) {
      continue;
    }
    if (static_cast<int>(o) == ordinal) {
      return true;
    }
    int can = 0;
    POOLSCOPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, ordinal, static_cast<int>(o)));
    return can != 0;
  }
  return false;
}
}  // namespace

std::vector<char> ipc_pairs(const std::vector<std::int64_t>& gathered,
                            const std::vector<int>& rank_of) {
  const std::size_t n = rank_of.size();
  if (gathered.size() != n * n) {
    throw invalid_argument("darray: an IPC table of " + std::to_string(gathered.size()) +
                           " entries for " + std::to_string(n) + " GPUs (expected " +
                           std::to_string(n * n) + ")");
  }
  std::vector<char> pairs(n * n, 0);
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t b = 0; b < n; ++b) {
      if (rank_of[a] != rank_of[b] && gathered[a * n + b] != 0 && gathered[b * n + a] != 0) {
        pairs[a * n + b] = 1;
      }
    }
  }
  return pairs;
}

std::string ipc_mismatch(const ipc_piece& got, std::uint64_t bytes, std::uint32_t sequence) {
  if (got.sequence != sequence) {
    return "piece " + std::to_string(got.sequence) + " of the pair arrived where piece " +
           std::to_string(sequence) + " was expected";
  }
  if (got.bytes != bytes) {
    return "a piece of " + std::to_string(got.bytes) + " bytes arrived where " +
           std::to_string(bytes) + " were expected";
  }
  return "";
}

ipc_links::ipc_links(std::shared_ptr<process_group> group, std::vector<int> ordinals, int first,
                     const std::vector<std::string>& uuids, const std::vector<int>& rank_of,
                     bool exportable)
    : group_(std::move(group)), n_(uuids.size()), first_(first) {
  try {
    int count = 0;
    POOLSCOPE_CUDA_CHECK(cudaGetDeviceCount(&count));
    std::vector<std::string> visible;
    for (int o = 0; o < count; ++o) {
      visible.push_back(seam::uuid_of(o));
    }
    // This rank's rows of the table; the other ranks' left at 1 for the minimum. A rank of
    // several GPUs links none (see the file comment).
    const bool one_gpu = ordinals.size() == 1;
    std::vector<std::int64_t> can(n_ * n_, 1);
    for (std::size_t i = 0; i < ordinals.size(); ++i) {
      const std::size_t a = static_cast<std::size_t>(first_) + i;
      for (std::size_t b = 0; b < n_; ++b) {
        can[a * n_ + b] = exportable && one_gpu && reaches(ordinals[i], uuids[b], visible) ? 1 : 0;
      }
    }
    pairs_ = ipc_pairs(group_->all_reduce(can, process_group::reduction::min), rank_of);
    bool any = false;
    for (std::size_t a = 0; a < n_; ++a) {
      for (std::size_t b = 0; b < n_; ++b) {
        any = any || pairs_[a * n_ + b] != 0;
        needs_nccl_ = needs_nccl_ || (rank_of[a] != rank_of[b] && pairs_[a * n_ + b] == 0);
      }
    }
    if (!any) {
      return;  // the same on every rank: no words to exchange
    }
    std::string mine;
    for (const int ordinal : ordinals) {
      auto g = std::make_unique<gpu>();
      g->ordinal = ordinal;
      g->sent.assign(n_, 0);
      g->received.assign(n_, 0);
      gpus_.push_back(std::move(g));
      gpu& d = *gpus_.back();
      const device_guard guard(ordinal);
      POOLSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&d.gate_stream, cudaStreamNonBlocking));
      POOLSCOPE_CUDA_CHECK(cudaMalloc(&d.words, n_ * sizeof(std::uint32_t)));
      POOLSCOPE_CUDA_CHECK(cudaMemset(d.words, 0, n_ * sizeof(std::uint32_t)));
      cudaIpcMemHandle_t h{};
      POOLSCOPE_CUDA_CHECK(cudaIpcGetMemHandle(&h, d.words));
      mine += hex_of(&h, sizeof h);
    }
    // Every word array is zeroed before any rank maps it: the gather is after every rank's memset.
    const std::vector<std::string> all = group_->all_gather(mine);
    peer_words_.assign(n_, nullptr);
    for (std::size_t b = 0; b < n_; ++b) {
      std::size_t linked_from = ordinals.size();
      for (std::size_t i = 0; i < ordinals.size() && linked_from == ordinals.size(); ++i) {
        if (linked(first_ + static_cast<int>(i), static_cast<int>(b))) {
          linked_from = i;
        }
      }
      if (linked_from == ordinals.size()) {
        continue;
      }
      // GPU b is the k-th of its rank.
      const int r = rank_of[b];
      std::size_t first_of_r = b;
      while (first_of_r > 0 && rank_of[first_of_r - 1] == r) {
        --first_of_r;
      }
      std::size_t gpus_of_r = 0;
      for (const int q : rank_of) {
        gpus_of_r += q == r ? 1 : 0;
      }
      const auto handles = handles_of(all.at(static_cast<std::size_t>(r)), gpus_of_r);
      const device_guard guard(ordinals[linked_from]);
      void* p = nullptr;
      POOLSCOPE_CUDA_CHECK(
          cudaIpcOpenMemHandle(&p, handles[b - first_of_r], cudaIpcMemLazyEnablePeerAccess));
      peer_words_[b] = static_cast<std::uint32_t*>(p);
    }
  } catch (...) {
    release();
    throw;
  }
}

ipc_links::~ipc_links() {
  release();
}

void ipc_links::release() noexcept {
  for (std::uint32_t*& p : peer_words_) {
    if (p != nullptr) {
      log_failure("cudaIpcCloseMemHandle", [p] { POOLSCOPE_CUDA_CHECK(cudaIpcCloseMemHandle(p)); });
      p = nullptr;
    }
  }
  for (auto& [handle, p] : mappings_) {
    log_failure("cudaIpcCloseMemHandle",
                [p = p] { POOLSCOPE_CUDA_CHECK(cudaIpcCloseMemHandle(p)); });
  }
  mappings_.clear();
  for (auto& g : gpus_) {
    log_failure("release IPC words", [&g] {
      const device_guard guard(g->ordinal);
      if (g->gate_stream != nullptr) {
        POOLSCOPE_CUDA_CHECK(cudaStreamSynchronize(g->gate_stream));
        POOLSCOPE_CUDA_CHECK(cudaStreamDestroy(g->gate_stream));
        g->gate_stream = nullptr;
      }
      if (g->words != nullptr) {
        POOLSCOPE_CUDA_CHECK(cudaFree(g->words));
        g->words = nullptr;
      }
    });
  }
}

std::uint64_t ipc_links::exported(const void* p, cudaIpcMemHandle_t& handle) {
  // The allocation holding p, and its id: unique in the process's life, so a handle kept by id
  // is never one of another allocation made later at the same address.
  CUdeviceptr base = 0;
  unsigned long long id = 0;
  std::array<CUpointer_attribute, 2> asked{CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                           CU_POINTER_ATTRIBUTE_BUFFER_ID};
  std::array<void*, 2> into{&base, &id};
  POOLSCOPE_CUDA_CHECK(pointer_attributes()(2, asked.data(), into.data(), address(p)));
  const std::lock_guard lock(mappings_mutex_);
  auto it = exported_.find(id);
  if (it == exported_.end()) {
    cudaIpcMemHandle_t h{};
    POOLSCOPE_CUDA_CHECK(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)));
    it = exported_.emplace(id, h).first;
  }
  handle = it->second;
  return address(p) - base;
}

void* ipc_links::mapped(int local, const cudaIpcMemHandle_t& handle) {
  std::string key(reinterpret_cast<const char*>(&handle), sizeof handle);
  const std::lock_guard lock(mappings_mutex_);
  if (const auto it = mappings_.find(key); it != mappings_.end()) {
    return it->second;
  }
  const device_guard guard(gpus_[static_cast<std::size_t>(local)]->ordinal);
  void* p = nullptr;
  POOLSCOPE_CUDA_CHECK(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess));
  mappings_.emplace(std::move(key), p);
  return p;
}

void ipc_links::send(int local, cudaStream_t s, const void* src, std::size_t bytes, int peer,
                     int peer_rank, int tag) {
  gpu& g = *gpus_.at(static_cast<std::size_t>(local));
  const int me = first_ + local;
  ipc_piece piece;
  try {
    group_->receive(&piece, sizeof piece, peer_rank, tag);
  } catch (const communication_error& e) {
    throw communication_error(std::string(e.what()) + " (the message of where device " +
                              std::to_string(peer) + " takes a piece of " + format_bytes(bytes) +
                              " from device " + std::to_string(me) + " through CUDA IPC)");
  }
  const std::lock_guard lock(g.mutex);
  const std::uint32_t expected = g.sent[static_cast<std::size_t>(peer)] + 1;
  if (const std::string wrong = ipc_mismatch(piece, bytes, expected); !wrong.empty()) {
    throw communication_error("darray cuda backend, " + group_->describe() + ": from device " +
                              std::to_string(me) + " to device " + std::to_string(peer) +
                              " of rank " + std::to_string(peer_rank) + ", " + wrong +
                              " (the ranks do not run the same program)");
  }
  auto* dst = static_cast<std::byte*>(mapped(local, piece.handle)) + piece.offset;
  POOLSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  POOLSCOPE_CUDA_CHECK(
      write_value()(s, address(peer_word(peer, static_cast<std::size_t>(me))), piece.sequence, 0));
  g.sent[static_cast<std::size_t>(peer)] = piece.sequence;
}

void ipc_links::receive(int local, cudaStream_t s, void* dst, std::size_t bytes, int peer,
                        int peer_rank, int tag) {
  gpu& g = *gpus_.at(static_cast<std::size_t>(local));
  ipc_piece piece;
  piece.offset = exported(dst, piece.handle);
  piece.bytes = bytes;
  {
    const std::lock_guard lock(g.mutex);
    piece.sequence = g.received[static_cast<std::size_t>(peer)] + 1;
    // The stream goes on once the piece has arrived.
    POOLSCOPE_CUDA_CHECK(wait_value()(s, address(g.words + static_cast<std::size_t>(peer)),
                                      piece.sequence, CU_STREAM_WAIT_VALUE_GEQ));
    g.received[static_cast<std::size_t>(peer)] = piece.sequence;
  }
  group_->send(&piece, sizeof piece, peer_rank, tag);
}

void ipc_links::open_gates() noexcept {
  // Stream waits compare cyclically ((int32_t)(word - value) >= 0), so "past any piece" is a
  // quarter of the cycle past the last piece each word stands for, not the largest value.
  constexpr std::uint32_t ahead = std::uint32_t{1} << 30;
  for (auto& g : gpus_) {
    log_failure("open the IPC gates", [&g, this] {
      const std::lock_guard lock(g->mutex);
      g->opened.resize(n_);
      for (std::size_t b = 0; b < n_; ++b) {
        g->opened[b] = g->received[b] + ahead;
      }
      const device_guard guard(g->ordinal);
      POOLSCOPE_CUDA_CHECK(cudaMemcpyAsync(g->words, g->opened.data(), n_ * sizeof(std::uint32_t),
                                           cudaMemcpyHostToDevice, g->gate_stream));
    });
  }
}

}  // namespace poolscope::darray::detail
