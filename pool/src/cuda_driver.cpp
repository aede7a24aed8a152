// The driver part of the CUDA seam (detail/cuda_seam.hpp, namespace cudrv): the virtual memory
// management calls of vmm_resource, reached through the runtime's entry-point lookup.
#include <cudaTypedefs.h>

#include <string>

#include "detail/cuda_seam.hpp"
#include "poolscope/log.hpp"

namespace poolscope::pool::detail {

namespace {

// The driver entry points vmm_resource needs, looked up once (CUDA 12.0 signatures).
struct driver_api {
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
  std::string missing;  // the first symbol not found ("" when all were)
};

constexpr unsigned entry_point_version = 12000;

template <typename Fn>
void look_up(const char* symbol, Fn& fn, std::string& missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t status =
      cudaGetDriverEntryPointByVersion(symbol, &p, entry_point_version, cudaEnableDefault, &found);
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    if (missing.empty()) {
      missing = std::string(symbol) + " (" + cudaGetErrorName(status) + ")";
    }
    return;
  }
  fn = reinterpret_cast<Fn>(p);
}

const driver_api& api() {
  static const driver_api a = [] {
    driver_api d;
    look_up("cuDeviceGet", d.device_get, d.missing);
    look_up("cuDeviceGetAttribute", d.device_get_attribute, d.missing);
    look_up("cuMemGetAllocationGranularity", d.mem_get_allocation_granularity, d.missing);
    look_up("cuMemAddressReserve", d.mem_address_reserve, d.missing);
    look_up("cuMemAddressFree", d.mem_address_free, d.missing);
    look_up("cuMemCreate", d.mem_create, d.missing);
    look_up("cuMemRelease", d.mem_release, d.missing);
    look_up("cuMemMap", d.mem_map, d.missing);
    look_up("cuMemUnmap", d.mem_unmap, d.missing);
    look_up("cuMemSetAccess", d.mem_set_access, d.missing);
    return d;
  }();
  return a;
}

CUdeviceptr dptr(const void* p) noexcept {
  return reinterpret_cast<CUdeviceptr>(p);
}

CUmemAllocationProp pinned_on(CUdevice dev) noexcept {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  return prop;
}

CUdevice device_handle(int device) {
  CUdevice dev = 0;
  POOLSCOPE_CUDA_CHECK(api().device_get(&dev, device));
  return dev;
}

}  // namespace

namespace cudrv {

void require_vmm(int device, const char* who) {
  cudart::require_device(device, who);
  const driver_api& a = api();
  if (!a.missing.empty()) {
    throw device_unavailable(std::string("poolscope: ") + who +
                             ": the CUDA driver lacks the entry point " + a.missing);
  }
  {
    // The primary context: the runtime creates it on first use, and the driver calls act in it.
    const cudart::device_guard guard{device};
    POOLSCOPE_CUDA_CHECK(cudaFree(nullptr));
  }
  int supported = 0;
  POOLSCOPE_CUDA_CHECK(a.device_get_attribute(
      &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device_handle(device)));
  if (supported == 0) {
    throw device_unavailable(std::string("poolscope: ") + who + ": device " +
                             std::to_string(device) +
                             " does not support virtual memory management");
  }
}

std::size_t granularity(int device) {
  const CUmemAllocationProp prop = pinned_on(device_handle(device));
  std::size_t g = 0;
  POOLSCOPE_CUDA_CHECK(
      api().mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return g;
}

std::size_t total_memory(int device) {
  cudaDeviceProp prop{};
  POOLSCOPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.totalGlobalMem;
}

void* address_reserve(std::size_t bytes, std::size_t alignment) {
  CUdeviceptr p = 0;
  POOLSCOPE_CUDA_CHECK(api().mem_address_reserve(&p, bytes, alignment, 0, 0));
  return reinterpret_cast<void*>(p);
}

void address_free(void* ptr, std::size_t bytes) noexcept {
  logged([&] { POOLSCOPE_CUDA_CHECK(api().mem_address_free(dptr(ptr), bytes)); });
}

bool map(void* ptr, std::size_t bytes, std::size_t granule, int device,
         const std::vector<int>& access) {
  const driver_api& a = api();
  const CUmemAllocationProp prop = pinned_on(device_handle(device));
  std::size_t done = 0;
  try {
    for (; done < bytes; done += granule) {
      CUmemGenericAllocationHandle handle = 0;
      const CUresult created = a.mem_create(&handle, granule, &prop, 0);
      if (created == CUDA_ERROR_OUT_OF_MEMORY) {
        unmap(ptr, done, granule);
        return false;
      }
      POOLSCOPE_CUDA_CHECK(created);
      const CUresult mapped =
          a.mem_map(dptr(static_cast<char*>(ptr) + done), granule, 0, handle, 0);
      // The mapping holds the memory from here on: the handle is not needed to unmap it.
      const CUresult released = a.mem_release(handle);
      POOLSCOPE_CUDA_CHECK(mapped);
      POOLSCOPE_CUDA_CHECK(released);
    }
    std::vector<CUmemAccessDesc> desc(access.size());
    for (std::size_t i = 0; i < access.size(); ++i) {
      desc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      desc[i].location.id = device_handle(access[i]);
      desc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    POOLSCOPE_CUDA_CHECK(a.mem_set_access(dptr(ptr), bytes, desc.data(), desc.size()));
  } catch (...) {
    unmap(ptr, done, granule);
    throw;
  }
  return true;
}

void unmap(void* ptr, std::size_t bytes, std::size_t granule) noexcept {
  // One call per granule: each is a mapping of its own, and cuMemUnmap takes whole mappings.
  for (std::size_t off = 0; off < bytes; off += granule) {
    logged([&] {
      POOLSCOPE_CUDA_CHECK(api().mem_unmap(dptr(static_cast<char*>(ptr) + off), granule));
    });
  }
}

}  // namespace cudrv

namespace cudart {

std::vector<int> peers_of(int device) {
  std::vector<int> peers;
  for (int d = 0, n = device_count(); d < n; ++d) {
    int can = 0;
    if (d != device) {
      POOLSCOPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, d, device));
    }
    if (can != 0) {
      peers.push_back(d);
    }
  }
  return peers;
}

}  // namespace cudart

}  // namespace poolscope::pool::detail
