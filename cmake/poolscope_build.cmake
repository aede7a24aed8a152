# Common settings for poolscope's own targets: warnings (as errors), sanitizers, feature switches.

set(_poolscope_cxx_warnings -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wcast-align -Wunused -Woverloaded-virtual -Wimplicit-fallthrough)

function(poolscope_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${_poolscope_cxx_warnings}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr>)
  if(POOLSCOPE_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
  endif()
  if(POOLSCOPE_SANITIZE)
    string(REPLACE ";" "," _san "${POOLSCOPE_SANITIZE}")
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
    if(POOLSCOPE_SANITIZE_CUDA)
      # nvcc splits -Xcompiler values at commas, so each sanitizer gets its own -fsanitize there.
      set(_cuda_san "")
      foreach(_s IN LISTS POOLSCOPE_SANITIZE)
        list(APPEND _cuda_san "-Xcompiler=-fsanitize=${_s}")
      endforeach()
      target_compile_options(${target} PRIVATE
        "$<$<COMPILE_LANGUAGE:CUDA>:${_cuda_san};-Xcompiler=-fno-omit-frame-pointer>")
    endif()
    target_link_options(${target} PRIVATE -fsanitize=${_san})
  endif()
endfunction()

# Adds a poolscope component library: poolscope_<name>, alias poolscope::<name>, exported.
function(poolscope_add_component name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(poolscope_${name} ${ARG_SOURCES})
  add_library(poolscope::${name} ALIAS poolscope_${name})
  # Installed, a component finds its sibling components next to itself ($ORIGIN) and libraries
  # outside the system's directories (CUDA, NCCL) where it was linked against them: an
  # application linking poolscope::darray loads without LD_LIBRARY_PATH.
  set_target_properties(poolscope_${name} PROPERTIES EXPORT_NAME ${name} OUTPUT_NAME poolscope_${name}
    INSTALL_RPATH "$ORIGIN" INSTALL_RPATH_USE_LINK_PATH ON)
  target_include_directories(poolscope_${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(poolscope_${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  target_compile_features(poolscope_${name} PUBLIC cxx_std_20)
  poolscope_target_defaults(poolscope_${name})
  install(TARGETS poolscope_${name} EXPORT poolscopeTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()
