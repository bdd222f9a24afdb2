# Builds a small program against the loom package just created, through loom's
# own installed loomConfig.cmake, requesting a component for each backend the
# package was built with, and runs it.
import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout


class LoomTestPackage(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    test_type = "explicit"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        loom = self.dependencies["loom"]
        tc = CMakeToolchain(self)
        tc.user_presets_path = False  # leave no CMakeUserPresets.json in the source tree
        tc.cache_variables["LOOM_TEST_COMPONENTS"] = ";".join(
            c for c in ("mpi", "cuda", "nccl") if loom.options.get_safe(f"with_{c}"))
        tc.cache_variables["LOOM_EXPECTED_VERSION"] = str(loom.ref.version)
        tc.generate()
        CMakeDeps(self).generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if can_run(self):
            self.run(os.path.join(self.cpp.build.bindir, "test_package"), env="conanrun")
