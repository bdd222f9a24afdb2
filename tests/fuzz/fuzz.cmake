# Fuzzing loom's readers of untrusted text (tests/fuzz/fuzz_loom.cpp): the
# JSON parser, the safetensors reader and the plan files. libFuzzer comes
# with clang, so this needs the clang++ the header test found
# (LOOM_CLANG_CXX) and its fuzzer runtime; without them it says so and adds
# nothing. The suite compiles one binary (about 20 s on 2 cores) and runs
# each target for LOOM_FUZZ_SECONDS (3) from the seeds in tests/fuzz/corpus,
# writing what it learns under the build tree, never into the sources.
# Longer on demand, e.g. ten minutes of the JSON parser:
#   cmake --build build/release --target loom_fuzz
#   LOOM_FUZZ_TARGET=json build/release/tests/loom_fuzz -max_total_time=600 \
#       build/release/tests/fuzz_corpus/json tests/fuzz/corpus/json
set(LOOM_FUZZ_SECONDS 3 CACHE STRING "seconds each fuzz target runs in the test suite")

if(NOT LOOM_CLANG_CXX)
  return()
endif()
# Whether this clang has the fuzzer runtime: probed once, then cached.
if(NOT DEFINED LOOM_CLANG_FUZZER_LINKS)
  set(_probe_dir "${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe")
  file(CONFIGURE OUTPUT "${_probe_dir}/probe.cpp" CONTENT
       "#include <cstddef>\n#include <cstdint>\nextern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
  execute_process(COMMAND "${LOOM_CLANG_CXX}" -fsanitize=fuzzer,address "${_probe_dir}/probe.cpp" -o "${_probe_dir}/probe"
                  RESULT_VARIABLE _fuzzer_links OUTPUT_QUIET ERROR_QUIET)
  if(_fuzzer_links EQUAL 0)
    set(LOOM_CLANG_FUZZER_LINKS ON CACHE BOOL "${LOOM_CLANG_CXX} links -fsanitize=fuzzer")
  else()
    set(LOOM_CLANG_FUZZER_LINKS OFF CACHE BOOL "${LOOM_CLANG_CXX} links -fsanitize=fuzzer")
  endif()
endif()
if(NOT LOOM_CLANG_FUZZER_LINKS)
  message(STATUS "loom: ${LOOM_CLANG_CXX} cannot link -fsanitize=fuzzer; no fuzz tests")
  return()
endif()

loom_clang_include_flags(_fuzz_includes)
set(_fuzz_libraries "${BLAS_LIBRARIES}")
if(NOT _fuzz_libraries AND TARGET BLAS::BLAS)
  get_target_property(_fuzz_libraries BLAS::BLAS INTERFACE_LINK_LIBRARIES)
endif()
set(_fuzz_headers ${LOOM_ALL_HEADERS})
list(TRANSFORM _fuzz_headers PREPEND "${PROJECT_SOURCE_DIR}/")
set(_fuzz_binary "${CMAKE_CURRENT_BINARY_DIR}/loom_fuzz")
set(_fuzz_source "${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_loom.cpp")
add_custom_command(
  OUTPUT "${_fuzz_binary}"
  COMMAND "${LOOM_CLANG_CXX}" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
          ${_fuzz_includes} "${_fuzz_source}" -o "${_fuzz_binary}" ${_fuzz_libraries}
  DEPENDS "${_fuzz_source}" ${_fuzz_headers}
  WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
  COMMENT "Building the libFuzzer targets with ${LOOM_CLANG_CXX}"
  VERBATIM)
add_custom_target(loom_fuzz DEPENDS "${_fuzz_binary}")

add_test(NAME "fuzz: build the targets with clang"
         COMMAND "${CMAKE_COMMAND}" --build "${CMAKE_BINARY_DIR}" --target loom_fuzz)
set_tests_properties("fuzz: build the targets with clang" PROPERTIES FIXTURES_SETUP loom_fuzz
                     RESOURCE_LOCK ${LOOM_BUILD_TREE_LOCK})
foreach(target IN ITEMS json safetensors plan sharded_index)
  set(_corpus "${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus/${target}")
  set(_artifacts "${CMAKE_CURRENT_BINARY_DIR}/fuzz_artifacts/${target}/")
  file(MAKE_DIRECTORY "${_corpus}" "${_artifacts}")
  # libFuzzer adds new inputs to the first directory and only reads the seeds.
  add_test(NAME "fuzz: ${target} for ${LOOM_FUZZ_SECONDS} s"
           COMMAND "${_fuzz_binary}" -max_total_time=${LOOM_FUZZ_SECONDS} -artifact_prefix=${_artifacts}
                   -print_final_stats=1 "${_corpus}" "${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${target}")
  set_tests_properties("fuzz: ${target} for ${LOOM_FUZZ_SECONDS} s" PROPERTIES FIXTURES_REQUIRED loom_fuzz
                       ENVIRONMENT "LOOM_FUZZ_TARGET=${target}" TIMEOUT 300)
endforeach()
