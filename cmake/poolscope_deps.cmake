# Finds every third-party dependency once, with an error that says how to get it.

function(poolscope_require found pkg hint)
  if(NOT ${found})
    message(FATAL_ERROR "poolscope: ${pkg} was not found. ${hint}")
  endif()
endfunction()

find_package(Threads REQUIRED)

find_package(CUDAToolkit QUIET)
poolscope_require(CUDAToolkit_FOUND "the CUDA Toolkit (13.x)"
  "Install it under /usr/local/cuda or pass -DCUDAToolkit_ROOT=/path/to/cuda.")

# CMake < 3.27 looks for CUPTI only under extras/CUPTI; the toolkit may ship it in lib64.
if(NOT TARGET CUDA::cupti)
  find_library(POOLSCOPE_CUPTI_LIBRARY cupti
    HINTS "${CUDAToolkit_LIBRARY_DIR}" "${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/lib64")
  find_path(POOLSCOPE_CUPTI_INCLUDE cupti.h
    HINTS "${CUDAToolkit_INCLUDE_DIRS}" "${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/include")
  poolscope_require(POOLSCOPE_CUPTI_LIBRARY "CUPTI (libcupti.so)"
    "It ships with the CUDA Toolkit; pass -DPOOLSCOPE_CUPTI_LIBRARY=/path/to/libcupti.so.")
  add_library(CUDA::cupti SHARED IMPORTED)
  set_target_properties(CUDA::cupti PROPERTIES IMPORTED_LOCATION "${POOLSCOPE_CUPTI_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${POOLSCOPE_CUPTI_INCLUDE}")
endif()
if(NOT TARGET CUDA::nvtx3)
  message(FATAL_ERROR "poolscope: CUDA::nvtx3 was not found; NVTX3 headers ship with the CUDA Toolkit (include/nvtx3).")
endif()

find_package(NCCL QUIET)
poolscope_require(NCCL_FOUND "NCCL (nccl.h, libnccl.so)"
  "Install libnccl-dev, or pass -DNCCL_ROOT=/path/to/nccl.")

find_package(nlohmann_json 3.10 QUIET)
poolscope_require(nlohmann_json_FOUND "nlohmann_json" "On Debian/Ubuntu: apt-get install nlohmann-json3-dev.")

if(POOLSCOPE_BUILD_TOOLS)
  find_package(CLI11 QUIET)
  poolscope_require(CLI11_FOUND "CLI11" "On Debian/Ubuntu: apt-get install libcli11-dev.")
endif()
if(POOLSCOPE_BUILD_TESTS)
  find_package(GTest QUIET)
  poolscope_require(GTest_FOUND "GoogleTest" "On Debian/Ubuntu: apt-get install libgtest-dev.")
endif()
if(POOLSCOPE_BUILD_BENCH)
  find_package(benchmark QUIET)
  poolscope_require(benchmark_FOUND "Google Benchmark" "On Debian/Ubuntu: apt-get install libbenchmark-dev.")
endif()

# Optional: MPI, for DistributedArrays across the processes of a launch (darray's process group;
# the host devices' transfers between ranks). Absent -> every program runs as a group of one.
option(POOLSCOPE_WITH_MPI "Use MPI when found (darray process groups across ranks)" ON)
if(POOLSCOPE_WITH_MPI)
  find_package(MPI QUIET COMPONENTS C)
endif()
if(MPI_C_FOUND)
  message(STATUS "poolscope: MPI ${MPI_C_VERSION} found (launcher: ${MPIEXEC_EXECUTABLE})")
else()
  message(STATUS "poolscope: MPI not found; darray runs single-process (on Debian/Ubuntu: "
                 "apt-get install libopenmpi-dev openmpi-bin)")
endif()

# Optional: stack unwinding and symbolization for the line profiler. Absent -> degrade gracefully.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(POOLSCOPE_LIBDW QUIET IMPORTED_TARGET libdw)
  pkg_check_modules(POOLSCOPE_LIBUNWIND QUIET IMPORTED_TARGET libunwind)
endif()
