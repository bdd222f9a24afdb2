# vcpkg overlay port for loom. loom is not published anywhere vcpkg could
# download it from, so the port builds the checkout it sits in
# (ports/loom/../..), or the one named by the LOOM_SOURCE_DIR environment
# variable (vcpkg clears the environment: also set
# VCPKG_KEEP_ENV_VARS=LOOM_SOURCE_DIR). Usage: docs/packaging.md.

# Header-only: one release configure/install is the whole package.
set(VCPKG_BUILD_TYPE release)

if(DEFINED ENV{LOOM_SOURCE_DIR})
  set(SOURCE_PATH "$ENV{LOOM_SOURCE_DIR}")
else()
  set(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../..")
endif()
get_filename_component(SOURCE_PATH "${SOURCE_PATH}" ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/loom/version.hpp")
  message(FATAL_ERROR "loom: ${SOURCE_PATH} is not a loom checkout (no include/loom/version.hpp); "
                      "set LOOM_SOURCE_DIR and VCPKG_KEEP_ENV_VARS=LOOM_SOURCE_DIR")
endif()
if(NOT EXISTS "${SOURCE_PATH}/LICENSE")
  message(FATAL_ERROR "loom: ${SOURCE_PATH}/LICENSE is missing; vcpkg installs it as share/loom/copyright")
endif()

# vcpkg.json's version has to be typed by hand; refuse to package a checkout
# whose version.hpp (the source of truth) says otherwise.
file(STRINGS "${SOURCE_PATH}/include/loom/version.hpp" _loom_version_lines
     REGEX "^#define LOOM_VERSION_(MAJOR|MINOR|PATCH) [0-9]+$")
set(_loom_version "")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "LOOM_VERSION_${_part} ([0-9]+)" _ "${_loom_version_lines}")
  list(APPEND _loom_version "${CMAKE_MATCH_1}")
endforeach()
list(JOIN _loom_version "." _loom_version)
if(NOT _loom_version STREQUAL VERSION)
  message(FATAL_ERROR "loom: the checkout is version ${_loom_version} but ports/loom/vcpkg.json says ${VERSION}; "
                      "set \"version\": \"${_loom_version}\" in ports/loom/vcpkg.json")
endif()

# Each feature turns its backend ON (missing backend = configure error) or OFF.
vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    mpi  LOOM_WITH_MPI
    cuda LOOM_WITH_CUDA
    nccl LOOM_WITH_NCCL
)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    ${FEATURE_OPTIONS}
    -DLOOM_BUILD_TESTS=OFF
    -DLOOM_BUILD_EXAMPLES=OFF
    -DLOOM_BUILD_BENCH=OFF
)
vcpkg_cmake_install()
# loom installs its config to share/cmake/loom; vcpkg wants share/loom.
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/loom)

# Nothing is compiled, so there are no libraries and no debug tree.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug" "${CURRENT_PACKAGES_DIR}/lib")
file(GLOB _loom_share_cmake "${CURRENT_PACKAGES_DIR}/share/cmake/*")
if(NOT _loom_share_cmake)
  file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/share/cmake")
endif()

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
