// The profiler's NVTX seam: the one place in poolscope that includes the NVTX3 headers
// (CUDA::nvtx3, header-only). Everything else calls these thin wrappers.
//
// Preconditions: none. Every NVTX call is safe with no tool attached: NVTX initializes itself on
// the first call (loading the library named by NVTX_INJECTION64_PATH, if any) and turns every
// function into a no-op when no tool is there; handles are then null. Nothing here throws, nothing
// here allocates through poolscope.
// Error convention: NVTX reports nothing; a tool that rejects a call simply ignores it.
// Thread safety: NVTX calls are thread-safe; ranges nest per thread and per domain.
// Cost without a tool: one load and a branch per call (after initialization).
#pragma once

#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>

#include <cstddef>
#include <cstdint>

#include "poolscope/profiler/scope.hpp"

namespace poolscope::profiler::detail {

/// The "poolscope" domain, created on first use together with the category names (pool=1,
/// darray.transfer=2, darray.compute=3, user=4). Null when no tool is attached. Also sets the
/// flag_nvtx bit of g_scope_flags when a tool is attached. Defined in nvtx.cpp.
[[nodiscard]] nvtxDomainHandle_t nvtx_domain() noexcept;

/// ARGB colour of a category (Okabe-Ito palette: readable by colour-blind users).
[[nodiscard]] constexpr std::uint32_t nvtx_color(category c) noexcept {
  switch (c) {
    case category::pool:
      return 0xFFE69F00U;  // orange
    case category::darray_transfer:
      return 0xFF0072B2U;  // blue
    case category::darray_compute:
      return 0xFF009E73U;  // green
    case category::user:
      break;
  }
  return 0xFFCC79A7U;  // reddish purple
}

namespace nvtx_seam {

/// nvtxDomainCreateA.
[[nodiscard]] inline nvtxDomainHandle_t create_domain(const char* name) noexcept {
  return nvtxDomainCreateA(name);
}
/// nvtxDomainNameCategoryA.
inline void name_category(nvtxDomainHandle_t d, category c, const char* name) noexcept {
  nvtxDomainNameCategoryA(d, static_cast<std::uint32_t>(c), name);
}
/// nvtxDomainRegisterStringA; `s` must be NUL-terminated.
[[nodiscard]] inline nvtxStringHandle_t register_string(nvtxDomainHandle_t d,
                                                        const char* s) noexcept {
  return nvtxDomainRegisterStringA(d, s);
}

/// Attributes of a range or mark of category `c` (colour from the category).
[[nodiscard]] inline nvtxEventAttributes_t attributes(category c) noexcept {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.category = static_cast<std::uint32_t>(c);
  a.colorType = NVTX_COLOR_ARGB;
  a.color = nvtx_color(c);
  return a;
}

/// Pushes a range named by a registered string.
inline void push_range(nvtxDomainHandle_t d, const void* registered, category c) noexcept {
  nvtxEventAttributes_t a = attributes(c);
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = static_cast<nvtxStringHandle_t>(const_cast<void*>(registered));
  nvtxDomainRangePushEx(d, &a);
}
/// Pushes a range named by an ASCII string (used when the name could not be registered).
inline void push_range_ascii(nvtxDomainHandle_t d, const char* message, category c) noexcept {
  nvtxEventAttributes_t a = attributes(c);
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = message;
  nvtxDomainRangePushEx(d, &a);
}
/// Pops the innermost range of this thread in `d`.
inline void pop_range(nvtxDomainHandle_t d) noexcept {
  nvtxDomainRangePop(d);
}
/// An instantaneous mark with an ASCII message and an unsigned 64-bit payload.
inline void mark(nvtxDomainHandle_t d, category c, const char* message,
                 std::uint64_t payload) noexcept {
  nvtxEventAttributes_t a = attributes(c);
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = message;
  a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  a.payload.ullValue = payload;
  nvtxDomainMarkEx(d, &a);
}

/// Registers [ptr, ptr + bytes) as a sub-allocator heap (NVTX memory API); returns its handle
/// (null without a tool).
[[nodiscard]] inline nvtxMemHeapHandle_t heap_register(nvtxDomainHandle_t d, const void* ptr,
                                                       std::size_t bytes) noexcept {
  nvtxMemVirtualRangeDesc_t range{};
  range.ptr = ptr;
  range.size = bytes;
  nvtxMemHeapDesc_t desc{};
  desc.extCompatID = NVTX_EXT_COMPATID_MEM;
  desc.structSize = sizeof(desc);
  desc.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
  desc.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  desc.typeSpecificDescSize = sizeof(range);
  desc.typeSpecificDesc = &range;
  desc.category = static_cast<std::uint32_t>(category::pool);
  return nvtxMemHeapRegister(d, &desc);
}
/// Unregisters a heap (and with it every region still registered inside it).
inline void heap_unregister(nvtxDomainHandle_t d, nvtxMemHeapHandle_t heap) noexcept {
  nvtxMemHeapUnregister(d, heap);
}
/// Registers [ptr, ptr + bytes) as a region of `heap`.
inline void region_register(nvtxDomainHandle_t d, nvtxMemHeapHandle_t heap, const void* ptr,
                            std::size_t bytes) noexcept {
  nvtxMemVirtualRangeDesc_t range{};
  range.ptr = ptr;
  range.size = bytes;
  nvtxMemRegionsRegisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.heap = heap;
  batch.regionCount = 1;
  batch.regionDescElementSize = sizeof(range);
  batch.regionDescElements = &range;
  batch.regionHandleElementsOut = nullptr;
  nvtxMemRegionsRegister(d, &batch);
}
/// Unregisters the region starting at `ptr` (referenced by pointer).
inline void region_unregister(nvtxDomainHandle_t d, const void* ptr) noexcept {
  nvtxMemRegionRef_t ref{};
  ref.pointer = ptr;
  nvtxMemRegionsUnregisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
  batch.refCount = 1;
  batch.refElementSize = sizeof(ref);
  batch.refElements = &ref;
  nvtxMemRegionsUnregister(d, &batch);
}

}  // namespace nvtx_seam
}  // namespace poolscope::profiler::detail
