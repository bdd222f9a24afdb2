# FindNCCL: NCCL ships no CMake package. Looks next to the CUDA toolkit and in
# the system paths; defines NCCL::NCCL, NCCL_FOUND and NCCL_VERSION.
include_guard(GLOBAL)

set(_nccl_hints $ENV{NCCL_HOME} $ENV{NCCL_ROOT})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _ "${_nccl_lines}")
    set(_nccl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
