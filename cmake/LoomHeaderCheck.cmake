# loom_add_header_check(target): one generated translation unit per public
# header, each including only that header, compiled as part of the build.
# Host headers compile with the plain C++ compiler against loom::loom alone;
# backend headers (named *_mpi.hpp, *_cuda.hpp, *_nccl.hpp, *.cuh) against
# their backend target, and *.cuh with nvcc (*_nccl.cuh against loom::nccl,
# the other *.cuh against loom::cuda). A header that forgets an include
# or defines a non-inline function (caught by including it twice, in two TUs
# linked together) fails the build.
include_guard(GLOBAL)

function(loom_add_header_check target)
  set(gen_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}_sources")
  set(groups host mpi cuda nccl cu cunccl)
  foreach(group IN LISTS groups)
    set(sources_${group} "")
  endforeach()
  foreach(header IN LISTS LOOM_ALL_HEADERS)
    string(REGEX REPLACE "^include/" "" include_name "${header}")
    string(MAKE_C_IDENTIFIER "${include_name}" stem)
    if(header MATCHES "_nccl\\.cuh$")
      set(group cunccl)
      set(ext cu)
    elseif(header MATCHES "\\.cuh$")
      set(group cu)
      set(ext cu)
    elseif(header MATCHES "_mpi\\.hpp$")
      set(group mpi)
      set(ext cpp)
    elseif(header MATCHES "_nccl\\.hpp$")
      set(group nccl)
      set(ext cpp)
    elseif(header MATCHES "_cuda\\.hpp$")
      set(group cuda)
      set(ext cpp)
    else()
      set(group host)
      set(ext cpp)
    endif()
    # Two TUs per header: a duplicate definition of a non-inline function
    # becomes a link error when both are linked into one program.
    foreach(copy a b)
      set(file "${gen_dir}/${stem}_${copy}.${ext}")
      file(CONFIGURE OUTPUT "${file}" CONTENT "#include <${include_name}>\n#include <${include_name}>  // guarded\n")
      list(APPEND sources_${group} "${file}")
    endforeach()
  endforeach()

  set(main "${gen_dir}/main.cpp")
  file(CONFIGURE OUTPUT "${main}" CONTENT "int main() { return 0; }\n")
  add_executable(${target} EXCLUDE_FROM_ALL "${main}" ${sources_host})
  target_link_libraries(${target} PRIVATE loom::loom)
  loom_strict(${target})
  if(sources_mpi AND TARGET loom::mpi)
    target_sources(${target} PRIVATE ${sources_mpi})
    target_link_libraries(${target} PRIVATE loom::mpi)
  endif()
  if(sources_cuda AND TARGET loom::cuda)
    target_sources(${target} PRIVATE ${sources_cuda})
    target_link_libraries(${target} PRIVATE loom::cuda)
  endif()
  if(sources_nccl AND TARGET loom::nccl)
    target_sources(${target} PRIVATE ${sources_nccl})
    target_link_libraries(${target} PRIVATE loom::nccl)
  endif()
  if(sources_cu AND LOOM_BUILD_CUDA_CODE)
    target_sources(${target} PRIVATE ${sources_cu})
    target_link_libraries(${target} PRIVATE loom::cuda)
  endif()
  if((sources_cu OR sources_cunccl) AND LOOM_BUILD_CUDA_CODE)
    # Whether a header stands alone does not depend on the GPU: one virtual
    # architecture (PTX, no ptxas), not the project's cubins for sm_90 and
    # sm_80. Two of each .cuh with their kernels compiled for both took this
    # check past 15 minutes of CI on 2 cores once the mma.sync attention
    # headers came; the cubins themselves are built, and checked, with the
    # tests (tests/cuda).
    set_property(TARGET ${target} PROPERTY CUDA_ARCHITECTURES 90-virtual)
  endif()
  if(sources_cunccl AND LOOM_BUILD_CUDA_CODE AND TARGET loom::nccl)
    target_sources(${target} PRIVATE ${sources_cunccl})
    target_link_libraries(${target} PRIVATE loom::nccl)
  endif()
endfunction()
