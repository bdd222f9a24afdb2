# Defines loom::blas, the CBLAS the host kernels call. OpenBLAS is preferred (it
# is what Debian's libopenblas-dev ships); any BLAS that CMake finds will do
# as long as it provides cblas.h. Installed next to loomConfig.cmake so that a
# consumer of the installed package resolves the same way.
include_guard(GLOBAL)

if(NOT TARGET loom::blas)
  if(NOT DEFINED BLA_VENDOR)
    set(BLA_VENDOR OpenBLAS)
    find_package(BLAS QUIET)
    unset(BLA_VENDOR)
  endif()
  if(NOT BLAS_FOUND)
    find_package(BLAS REQUIRED)
  endif()
  find_path(LOOM_CBLAS_INCLUDE_DIR cblas.h
    PATH_SUFFIXES openblas openblas-pthread x86_64-linux-gnu aarch64-linux-gnu)
  if(NOT LOOM_CBLAS_INCLUDE_DIR)
    message(FATAL_ERROR "loom: found BLAS (${BLAS_LIBRARIES}) but no cblas.h; install libopenblas-dev")
  endif()
  add_library(loom::blas INTERFACE IMPORTED)
  target_link_libraries(loom::blas INTERFACE BLAS::BLAS)
  target_include_directories(loom::blas INTERFACE "${LOOM_CBLAS_INCLUDE_DIR}")
endif()
