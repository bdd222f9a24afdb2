// loom's version: the single source of truth (CMakeLists.txt, conanfile.py and
// the vcpkg port read it from here).
#pragma once

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0

namespace loom {

struct Version {
    int major, minor, patch;
};

inline constexpr Version version{LOOM_VERSION_MAJOR, LOOM_VERSION_MINOR, LOOM_VERSION_PATCH};

}  // namespace loom
