# Fails if a host-core header includes a CUDA, NCCL or MPI header. Backend
# headers are recognised by name: *.cuh, *_cuda.hpp, *_nccl.hpp, *_mpi.hpp.
file(GLOB_RECURSE headers RELATIVE "${LOOM_INCLUDE_DIR}" "${LOOM_INCLUDE_DIR}/loom/*.hpp")
set(bad "")
set(checked 0)
foreach(header IN LISTS headers)
  if(header MATCHES "(_cuda|_nccl|_mpi)\\.hpp$")
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  file(STRINGS "${LOOM_INCLUDE_DIR}/${header}" includes REGEX "^[ \t]*#[ \t]*include")
  foreach(line IN LISTS includes)
    if(line MATCHES "[<\"](cuda[_a-z]*\\.h|cu[a-z]+_api\\.h|cublas[A-Za-z_]*\\.h|nccl\\.h|mpi\\.h|cub/|thrust/)"
       OR line MATCHES "(_cuda|_nccl|_mpi)\\.hpp|\\.cuh")
      list(APPEND bad "${header}: ${line}")
    endif()
  endforeach()
endforeach()
include("${CMAKE_CURRENT_LIST_DIR}/include_rule_report.cmake")
loom_include_rule_verdict("${checked}" "${bad}" "host-core headers include backend headers"
  "host-core headers include no CUDA, NCCL or MPI header")
