// A non-owning view of a stream: a cudaStream_t on CUDA backends, an opaque key on the host.
//
//   cudaStream_t s = ...;
//   void* p = alloc.allocate(poolscope::stream_view{s}, 1 << 20);
//
// Thread safety: a plain value. Cost: one pointer.
#pragma once

#include <cstdint>
#include <functional>

namespace poolscope {

/// A stream handle that poolscope does not own. The default view is the legacy default stream
/// (null). Converts implicitly from cudaStream_t (a pointer) without needing CUDA headers.
class stream_view {
 public:
  constexpr stream_view() noexcept = default;
  /// Views `handle` (a cudaStream_t, or any pointer-sized key on host backends).
  template <typename T>
  constexpr stream_view(T* handle) noexcept  // NOLINT(google-explicit-constructor)
      : handle_(static_cast<void*>(handle)) {}

  /// The raw handle (cast it back to cudaStream_t at the CUDA seam).
  [[nodiscard]] constexpr void* value() const noexcept { return handle_; }
  [[nodiscard]] constexpr bool is_default() const noexcept { return handle_ == nullptr; }
  /// A stable integer for logs and traces.
  [[nodiscard]] std::uintptr_t id() const noexcept {
    return reinterpret_cast<std::uintptr_t>(handle_);
  }

  friend constexpr bool operator==(stream_view a, stream_view b) noexcept {
    return a.handle_ == b.handle_;
  }

 private:
  void* handle_ = nullptr;
};

}  // namespace poolscope

template <>
struct std::hash<poolscope::stream_view> {
  std::size_t operator()(poolscope::stream_view s) const noexcept {
    return std::hash<void*>{}(s.value());
  }
};
