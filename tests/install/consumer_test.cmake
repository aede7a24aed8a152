# The installed package, as an application sees it (run by ctest: tests/CMakeLists.txt).
# Installs BUILD_DIR into a scratch prefix, configures examples/ (a project of its own) with
# find_package(poolscope) against it, builds it, and runs its programs and the installed
# `poolscope` command with LD_LIBRARY_PATH unset: every library must be found through the
# installed files alone (their RUNPATHs), as for a user who installs to a prefix of their own.
# With shared libraries (SHARED_LIBS), examples/ is configured with the CUDA toolkit and NCCL
# hidden from CMake, and host_only's compile command must name no CUDA directory: the package asks
# a consumer for nothing its public headers and link interface do not need.
#   cmake -DBUILD_DIR=... -DEXAMPLES_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX_COMPILER=...
#         [-DCONFIG=...] [-DSHARED_LIBS=ON|OFF] -P consumer_test.cmake
foreach(_var BUILD_DIR EXAMPLES_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "consumer_test.cmake: -D${_var}=... is required")
  endif()
endforeach()
if(NOT DEFINED CONFIG OR CONFIG STREQUAL "")
  set(CONFIG RelWithDebInfo)
endif()
if(NOT DEFINED SHARED_LIBS)
  set(SHARED_LIBS ON)
endif()
set(_without_cuda "")
if(SHARED_LIBS)
  set(_without_cuda -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
      -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON)
endif()

# Runs one step; on failure prints its output and stops the test, naming the step.
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${_rc}): ${ARGN}\n${_out}")
  endif()
  message(STATUS "${what}: ok")
  set(step_output "${_out}" PARENT_SCOPE)
endfunction()

unset(ENV{LD_LIBRARY_PATH})
file(REMOVE_RECURSE "${WORK_DIR}")
set(_prefix "${WORK_DIR}/prefix")
step("install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${_prefix}" --config "${CONFIG}")
step("configure examples/ with find_package(poolscope)" "${CMAKE_COMMAND}" -S "${EXAMPLES_DIR}"
  -B "${WORK_DIR}/build" -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${_prefix}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=${CONFIG}"
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON ${_without_cuda})
step("build examples/" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" --config "${CONFIG}")
if(SHARED_LIBS)
  file(READ "${WORK_DIR}/build/compile_commands.json" _commands)
  string(JSON _count LENGTH "${_commands}")
  math(EXPR _last "${_count} - 1")
  set(_host_only_command "")
  foreach(_i RANGE ${_last})
    string(JSON _file GET "${_commands}" ${_i} file)
    if(_file MATCHES "host_only\\.cpp$")
      string(JSON _host_only_command GET "${_commands}" ${_i} command)
    endif()
  endforeach()
  if(_host_only_command STREQUAL "")
    message(FATAL_ERROR "compile_commands.json of examples/ has no entry for host_only.cpp")
  endif()
  if(_host_only_command MATCHES "[Cc][Uu][Dd][Aa]|[Nn][Cc][Cc][Ll]")
    message(FATAL_ERROR "host_only.cpp compiled with a CUDA or NCCL path: ${_host_only_command}")
  endif()
  message(STATUS "host_only compiled with no CUDA or NCCL path: ok")
endif()

file(MAKE_DIRECTORY "${WORK_DIR}/out")
step("profile_workload (poolscope::pool, poolscope::profiler)" "${WORK_DIR}/build/profile_workload"
  "${WORK_DIR}/out")
foreach(_file alloc.txt alloc.json alloc.folded scopes.json)
  if(NOT EXISTS "${WORK_DIR}/out/${_file}")
    message(FATAL_ERROR "profile_workload wrote no ${_file}")
  endif()
endforeach()
step("host_only (host resource, host backend)" "${WORK_DIR}/build/host_only")
if(NOT step_output MATCHES "host_only: bfc over host memory checked")
  message(FATAL_ERROR "host_only printed no check:\n${step_output}")
endif()
step("distributed_add (poolscope::darray)" "${WORK_DIR}/build/distributed_add")
if(NOT step_output MATCHES "A \\+ C\\.reshard\\(A\\.index_map\\(\\)\\) checked")
  message(FATAL_ERROR "distributed_add printed no check:\n${step_output}")
endif()
# The installed command, and `poolscope report` reading what the example wrote.
if(EXISTS "${_prefix}/bin/poolscope")
  step("installed poolscope report" "${_prefix}/bin/poolscope" report "${WORK_DIR}/out/scopes.json")
  if(NOT step_output MATCHES "load_weights")
    message(FATAL_ERROR "poolscope report of scopes.json names no scope load_weights:\n${step_output}")
  endif()
endif()
