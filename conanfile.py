# Conan 2 recipe for loom: header-only, packaged by loom's own CMake install so
# that Conan, vcpkg and plain CMake consumers all use the same loomConfig.cmake.
# How to build and consume it (with a remote, or offline against Debian
# packages): docs/packaging.md.
import os
import re

from conan import ConanFile
from conan.errors import ConanException, ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load

required_conan_version = ">=2.1"


class LoomConan(ConanFile):
    name = "loom"
    license = "MIT"
    description = "Header-only C++20 toolkit for parallel neural-network training"
    topics = ("deep-learning", "parallel", "mpi", "cuda", "nccl", "header-only")
    package_type = "header-library"
    # Settings only drive the CMake configure that installs the package; they
    # are removed from the package id (see package_id()).
    settings = "os", "arch", "compiler", "build_type"
    # Backends. Each option adds the backend's targets (loom::mpi, loom::cuda,
    # loom::nccl) to the installed config, and makes the build fail if the
    # backend is missing. The backends themselves always come from the system
    # (see requirements()).
    options = {
        "with_mpi": [True, False],
        "with_cuda": [True, False],
        "with_nccl": [True, False],
    }
    default_options = {
        "with_mpi": False,
        "with_cuda": False,
        "with_nccl": False,
        # loom uses Boost.PFR only: never build Boost's compiled libraries for it.
        "boost/*:header_only": True,
    }
    exports_sources = "include/*", "cmake/*", "CMakeLists.txt", "LICENSE*"
    no_copy_source = True

    def set_version(self):
        # include/loom/version.hpp is the single source of truth, as for CMake.
        text = load(self, os.path.join(self.recipe_folder, "include", "loom", "version.hpp"))
        parts = [re.search(rf"^#define LOOM_VERSION_{p} (\d+)$", text, re.M) for p in ("MAJOR", "MINOR", "PATCH")]
        if not all(parts):
            raise ConanException("include/loom/version.hpp lacks LOOM_VERSION_MAJOR/MINOR/PATCH")
        self.version = ".".join(m.group(1) for m in parts)

    def layout(self):
        cmake_layout(self)

    def requirements(self):
        # Boost (for Boost.PFR) and a CBLAS are real dependencies: with a remote
        # they come from it; offline, a profile's [platform_requires] says the
        # system provides them (docs/packaging.md). Being a header library, they
        # reach loom's consumers (headers and libs) automatically.
        self.requires("boost/[>=1.81 <2]")
        self.requires("openblas/[>=0.3 <1]")
        # MPI, CUDA and NCCL are deliberately not Conan requirements: MPI must be
        # the cluster's own (it has to match mpirun and the fabric), and the CUDA
        # toolkit and NCCL are not Conan packages. loomConfig.cmake finds them
        # on the consumer's machine with CMake's FindMPI / FindCUDAToolkit and
        # loom's FindNCCL.

    def validate(self):
        # A header library is validated against its consumer's settings: they
        # must compile loom's headers as C++20.
        check_min_cppstd(self, 20)
        if self.options.with_nccl and not self.options.with_cuda:
            raise ConanInvalidConfiguration(
                "with_nccl=True needs with_cuda=True (NCCL runs between CUDA devices); "
                "pass -o 'loom/*:with_cuda=True' too")

    def generate(self):
        tc = CMakeToolchain(self)
        # loom's own tests, examples and benchmarks are never part of the package.
        for program in ("TESTS", "EXAMPLES", "BENCH"):
            tc.cache_variables[f"LOOM_BUILD_{program}"] = False
        # ON, not AUTO: a backend asked for and not found fails the build
        # instead of giving a package without it. OFF keeps the package the same
        # whatever happens to be installed on the packaging machine.
        for backend in ("mpi", "cuda", "nccl"):
            enabled = bool(self.options.get_safe(f"with_{backend}"))
            tc.cache_variables[f"LOOM_WITH_{backend.upper()}"] = "ON" if enabled else "OFF"
        tc.generate()
        # Config files for Boost/OpenBLAS when they come from Conan packages;
        # nothing for those the profile declares as [platform_requires].
        CMakeDeps(self).generate()

    def build(self):
        # Nothing is compiled; configuring checks that every dependency and
        # requested backend is found and writes loomConfig.cmake.
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        copy(self, "LICENSE*", self.source_folder, os.path.join(self.package_folder, "licenses"))
        cmake = CMake(self)
        cmake.install()

    def package_id(self):
        # Header-only: compiler, arch and build type do not change the package.
        # The backend options do (they decide which targets loomConfig.cmake
        # exports), so unlike self.info.clear() they stay in the package id.
        self.info.settings.clear()

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        # Consumers use loom's own installed config, not one generated by
        # CMakeDeps: find_package(loom CONFIG REQUIRED [COMPONENTS mpi cuda nccl]).
        # builddirs puts share/cmake/loom on CMAKE_PREFIX_PATH (CMakeToolchain)
        # and sets loom_DIR (CMakeConfigDeps).
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.set_property("cmake_file_name", "loom")
        self.cpp_info.set_property("cmake_target_name", "loom::loom")
        self.cpp_info.builddirs = [os.path.join("share", "cmake", "loom")]
