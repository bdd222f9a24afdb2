# Installs loom from the build tree into a fresh prefix, then configures,
# builds and runs a consumer project that finds it with find_package(loom).
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${step}:\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${step} failed with exit code ${rc}")
  endif()
endfunction()

run("install loom" "${CMAKE_COMMAND}" --install "${LOOM_BUILD_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/share/cmake/loom/loomConfig.cmake")
  message(FATAL_ERROR "install did not produce ${prefix}/share/cmake/loom/loomConfig.cmake")
endif()
if(NOT EXISTS "${prefix}/include/loom/core/reflect.hpp")
  message(FATAL_ERROR "install did not copy the headers into ${prefix}/include/loom")
endif()

run("configure consumer" "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build"
    -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_PREFIX_PATH=${prefix}"
    "-DCONSUMER_WITH_MPI=${WITH_MPI}")
run("build consumer" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("run consumer" "${WORK_DIR}/build/consumer")

# Asking for a component that does not exist must fail with a clear message.
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build-bad"
    -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_PREFIX_PATH=${prefix}"
    -DCONSUMER_BAD_COMPONENT=ON
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "loom has no component 'tpu'; valid components are mpi, cuda, nccl")
  message(FATAL_ERROR "find_package(loom COMPONENTS tpu) should fail naming the valid components; got:\n${out}${err}")
endif()
message(STATUS "consumer built and ran against ${prefix}; a bad component is refused")
