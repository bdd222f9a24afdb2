# loom_add_header_check(target): one generated translation unit per public
# header, each including only that header, compiled as part of the build.
# Host headers compile with the plain C++ compiler against loom::loom alone;
# backend headers (named *_mpi.hpp, *_cuda.hpp, *_nccl.hpp, *.cuh) against
# their backend target, and *.cuh with nvcc (*_nccl.cuh against loom::nccl,
# the other *.cuh against loom::cuda). A header that forgets an include
# or defines a non-inline function (caught by including it twice, in its own
# TU and in its group's TU of every header, linked together) fails the build.
include_guard(GLOBAL)

function(loom_add_header_check target)
  set(gen_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}_sources")
  set(groups host mpi cuda nccl cu cunccl)
  foreach(group IN LISTS groups)
    set(sources_${group} "")
    set(together_${group} "")
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
    # One TU per header proves it stands alone; the group's TU below
    # includes it a second time.
    set(file "${gen_dir}/${stem}_a.${ext}")
    file(CONFIGURE OUTPUT "${file}" CONTENT "#include <${include_name}>\n#include <${include_name}>  // guarded\n")
    list(APPEND sources_${group} "${file}")
    string(APPEND together_${group} "#include <${include_name}>\n")
    set(ext_${group} ${ext})
  endforeach()
  # A second TU per group including all its headers: a non-inline function
  # defined in a header is then defined twice in one program, a link error.
  # One TU per group, not a second one per header, halves the check's time
  # (it was 466 s of CI on 2 cores).
  foreach(group IN LISTS groups)
    if(sources_${group})
      set(file "${gen_dir}/all_${group}_b.${ext_${group}}")
      file(CONFIGURE OUTPUT "${file}" CONTENT "${together_${group}}")
      list(APPEND sources_${group} "${file}")
    endif()
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

# loom_clang_include_flags(out): the include flags a compiler outside the
# project's toolchain needs for loom::loom: include/, then the directories
# its dependencies bring (Boost, cblas.h) as system directories (their own
# warnings are not loom's); imported targets list them plainly, and the
# compiler's default directories stay its own.
function(loom_clang_include_flags out)
  set(flags "-I${PROJECT_SOURCE_DIR}/include")
  foreach(dependency IN ITEMS Boost::headers loom::blas)
    if(TARGET ${dependency})
      get_target_property(dirs ${dependency} INTERFACE_INCLUDE_DIRECTORIES)
      if(dirs)
        foreach(dir IN LISTS dirs)
          if(NOT dir MATCHES "^/usr(/local)?/include/?$")
            list(APPEND flags -isystem "${dir}")
          endif()
        endforeach()
      endif()
    endif()
  endforeach()
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

# loom_add_clang_header_test(name stem): one translation unit (<stem>.cpp) including every
# host header, checked by clang++ (-fsyntax-only, the warnings as errors) as
# a test, when a clang++ is found (LOOM_CLANG_CXX names another). A
# header-only library is compiled by its users' compiler, and clang 14 with
# libstdc++ 12 lacks what GCC has (std::source_location, parenthesised
# aggregate initialisation); one TU keeps it to seconds where a TU per
# header would cost minutes of CI.
function(loom_add_clang_header_test name stem)
  find_program(LOOM_CLANG_CXX NAMES clang++ clang++-18 clang++-17 clang++-16 clang++-15 clang++-14
               DOC "clang++ that checks the host headers (empty: no check)")
  if(NOT LOOM_CLANG_CXX)
    message(STATUS "loom: no clang++ found; the headers are checked with ${CMAKE_CXX_COMPILER_ID} only")
    return()
  endif()
  set(file "${CMAKE_CURRENT_BINARY_DIR}/${stem}.cpp")
  set(content "")
  foreach(header IN LISTS LOOM_ALL_HEADERS)
    if(header MATCHES "(_mpi|_cuda|_nccl)\\.hpp$" OR header MATCHES "\\.cuh$")
      continue()
    endif()
    string(REGEX REPLACE "^include/" "" include_name "${header}")
    string(APPEND content "#include <${include_name}>\n")
  endforeach()
  file(CONFIGURE OUTPUT "${file}" CONTENT "${content}")
  loom_clang_include_flags(include_flags)
  add_test(NAME "${name}"
           COMMAND "${LOOM_CLANG_CXX}" -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                   -Wno-sign-conversion -Werror ${include_flags} "${file}")
endfunction()

