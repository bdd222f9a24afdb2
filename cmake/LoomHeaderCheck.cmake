# loom_add_header_check(target): one generated translation unit per public
# header, each including only that header (twice, to prove its guard),
# compiled as an object library; building `target` then reads the objects'
# symbols (LoomHeaderSymbols.cmake). Host headers compile with the plain C++
# compiler against loom::loom alone; backend headers (named *_mpi.hpp,
# *_cuda.hpp, *_nccl.hpp, *.cuh) against their backend target, and *.cuh with
# nvcc (*_nccl.cuh against loom::nccl, the other *.cuh against loom::cuda).
# A header that forgets an include fails to compile; one that defines a
# non-inline function or variable leaves a strong global symbol in its
# object, which the symbol check names (two programs including the header
# would fail to link). Reading symbols replaced a second TU per group that
# included every header and linked them all: the nvcc ones alone cost 90 s.
#
# Most of a high-level header's check is parsing the loom headers below it
# (kernels/ops.hpp alone is 2.5 s of a 6 s check), the same for dozens of
# headers. So the host headers are checked in tiers: a header that includes
# (transitively) one of LOOM_HEADER_CHECK_TIERS, and that the tier's header
# does not include in turn, compiles with that tier's header precompiled
# (the largest such tier; the rest compile plainly). The check stays sound:
# the header would include the tier's header on its own anyway, and loom's
# headers include everything before their first line of code, so the
# precompiled prefix supplies nothing the header does not bring itself. The
# tier headers are the check's biggest savings (measured: each costs 1-7 s
# to parse and sits under 10-50 other headers).
include_guard(GLOBAL)

set(LOOM_HEADER_CHECK_TIERS loom/exec/executor.hpp loom/gpt/model.hpp loom/nn/context.hpp loom/kernels/ops.hpp
    loom/comm/communicator.hpp)

# loom_header_graph(headers...): each loom header's direct loom includes
# (loom_includes_<key>) and direct includers (loom_includers_<key>), key the
# include name as a C identifier, set in the caller's scope.
macro(loom_header_graph)
  foreach(graph_header IN ITEMS ${ARGN})
    string(REGEX REPLACE "^include/" "" graph_name "${graph_header}")
    string(MAKE_C_IDENTIFIER "${graph_name}" graph_key)
    file(STRINGS "${PROJECT_SOURCE_DIR}/${graph_header}" graph_lines REGEX "^#include [<\"]loom/")
    foreach(graph_line IN LISTS graph_lines)
      string(REGEX REPLACE "^#include [<\"](loom/[^>\"]*)[>\"].*$" "\\1" graph_included "${graph_line}")
      string(MAKE_C_IDENTIFIER "${graph_included}" graph_included_key)
      list(APPEND loom_includes_${graph_key} "${graph_included}")
      list(APPEND loom_includers_${graph_included_key} "${graph_name}")
    endforeach()
  endforeach()
endmacro()

# loom_header_reach(out root edge): the headers `root` reaches through
# loom_<edge>_<key> (edge: includes or includers), itself left out unless a
# cycle leads back to it.
function(loom_header_reach out root edge)
  set(found "")
  set(frontier "${root}")
  while(frontier)
    list(POP_FRONT frontier current)
    string(MAKE_C_IDENTIFIER "${current}" key)
    foreach(next IN LISTS loom_${edge}_${key})
      if(NOT next IN_LIST found)
        list(APPEND found "${next}")
        list(APPEND frontier "${next}")
      endif()
    endforeach()
  endwhile()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

function(loom_add_header_check target)
  set(gen_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}_sources")
  set(groups host mpi cuda nccl cu cunccl)
  foreach(group IN LISTS groups)
    set(sources_${group} "")
  endforeach()
  loom_header_graph(${LOOM_ALL_HEADERS})
  foreach(tier IN LISTS LOOM_HEADER_CHECK_TIERS)
    string(MAKE_C_IDENTIFIER "${tier}" tier_key)
    loom_header_reach(above_${tier_key} "${tier}" includers)
    loom_header_reach(below_${tier_key} "${tier}" includes)
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
    set(file "${gen_dir}/${stem}.${ext}")
    file(CONFIGURE OUTPUT "${file}" CONTENT "#include <${include_name}>\n#include <${include_name}>  // guarded\n")
    if(group STREQUAL "host")
      set(placed FALSE)
      foreach(tier IN LISTS LOOM_HEADER_CHECK_TIERS)
        string(MAKE_C_IDENTIFIER "${tier}" tier_key)
        # Above the tier, and not below it too (the executor's member
        # headers and executor.hpp include each other).
        if(include_name IN_LIST above_${tier_key} AND NOT include_name IN_LIST below_${tier_key})
          list(APPEND sources_tier_${tier_key} "${file}")
          set(placed TRUE)
          break()
        endif()
      endforeach()
      if(placed)
        continue()
      endif()
    endif()
    list(APPEND sources_${group} "${file}")
  endforeach()

  set(objects ${target}_objects)
  add_library(${objects} OBJECT EXCLUDE_FROM_ALL ${sources_host})
  set(all_objects "$<TARGET_OBJECTS:${objects}>")
  set(object_libraries ${objects})
  foreach(tier IN LISTS LOOM_HEADER_CHECK_TIERS)
    string(MAKE_C_IDENTIFIER "${tier}" tier_key)
    if(sources_tier_${tier_key})
      set(tier_objects ${target}_objects_${tier_key})
      add_library(${tier_objects} OBJECT EXCLUDE_FROM_ALL ${sources_tier_${tier_key}})
      target_precompile_headers(${tier_objects} PRIVATE "<${tier}>")
      list(APPEND object_libraries ${tier_objects})
      string(APPEND all_objects ";$<TARGET_OBJECTS:${tier_objects}>")
    endif()
  endforeach()
  # Whether a header stands alone, and which symbols it defines, do not
  # depend on optimisation; the tests and examples compile every header
  # optimised anyway. Unoptimised, the check's C++ compiles take about 15%
  # less (measured on train/sharded_optex.hpp: 4.2 s against 5.0 s).
  # The same for nvcc: its host side unoptimised, and its device side too (-G:
  # cicc at -O3 took two thirds of a kernel header's check; attention_mma.cuh
  # 6.5 s of CPU, 2.8 s with -G).
  foreach(library IN LISTS object_libraries)
    target_link_libraries(${library} PRIVATE loom::loom)
    loom_strict(${library})
    target_compile_options(${library} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0>
                                              $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-O0 -G>)
  endforeach()
  if(sources_mpi AND TARGET loom::mpi)
    target_sources(${objects} PRIVATE ${sources_mpi})
    target_link_libraries(${objects} PRIVATE loom::mpi)
  endif()
  if(sources_cuda AND TARGET loom::cuda)
    target_sources(${objects} PRIVATE ${sources_cuda})
    target_link_libraries(${objects} PRIVATE loom::cuda)
  endif()
  if(sources_nccl AND TARGET loom::nccl)
    target_sources(${objects} PRIVATE ${sources_nccl})
    target_link_libraries(${objects} PRIVATE loom::nccl)
  endif()
  if(sources_cu AND LOOM_BUILD_CUDA_CODE)
    target_sources(${objects} PRIVATE ${sources_cu})
    target_link_libraries(${objects} PRIVATE loom::cuda)
  endif()
  if((sources_cu OR sources_cunccl) AND LOOM_BUILD_CUDA_CODE)
    # Whether a header stands alone does not depend on the GPU: one virtual
    # architecture (PTX, no ptxas), not the project's cubins for sm_90 and
    # sm_80. Two of each .cuh with their kernels compiled for both took this
    # check past 15 minutes of CI on 2 cores once the mma.sync attention
    # headers came; the cubins themselves are built, and checked, with the
    # tests (tests/cuda).
    set_property(TARGET ${objects} PROPERTY CUDA_ARCHITECTURES 90-virtual)
  endif()
  if(sources_cunccl AND LOOM_BUILD_CUDA_CODE AND TARGET loom::nccl)
    target_sources(${objects} PRIVATE ${sources_cunccl})
    target_link_libraries(${objects} PRIVATE loom::nccl)
  endif()
  # The objects' paths, known at generation time, in a file the script reads.
  set(list_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_objects.txt")
  # (A tier's objects include its precompiled header, which holds no symbols to read.)
  file(GENERATE OUTPUT "${list_file}" CONTENT "$<JOIN:$<FILTER:${all_objects},EXCLUDE,\\.gch$>,\n>\n")
  add_custom_target(${target}
    COMMAND "${CMAKE_COMMAND}" "-DNM=${CMAKE_NM}" "-DOBJECT_LIST=${list_file}" "-DSOURCES_DIR=${gen_dir}"
            -P "${PROJECT_SOURCE_DIR}/cmake/LoomHeaderSymbols.cmake"
    DEPENDS ${object_libraries}
    COMMENT "Checking that no public header defines a non-inline symbol")
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

