// The CPU a benchmark ran on, as its rows name it: the model name with the
// family and model numbers (the same name covers several generations under a
// hypervisor, the numbers do not), and loom's GEMM level on it.
#pragma once

#include <loom/kernels/host/cpu_features.hpp>

#include <fstream>
#include <string>

namespace bench {

// "Intel(R) Xeon(R) Platinum 8480+ (family 6 model 207)", from /proc/cpuinfo.
inline std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line, name = "unknown CPU", family, model;
    const auto value = [&line] { return line.substr(line.find(':') + 2); };
    while (std::getline(in, line) && !line.empty()) {
        if (line.rfind("model name", 0) == 0) name = value();
        else if (line.rfind("cpu family", 0) == 0) family = value();
        else if (line.rfind("model\t", 0) == 0) model = value();  // not "model name"
    }
    if (!family.empty() && !model.empty()) name += " (family " + family + " model " + model + ")";
    return name;
}

// "avx512 (avx512_bf16)": the level loom's host GEMM runs at here.
inline std::string cpu_level() {
    const auto& cpu = loom::kernels::host::cpu_features();
    return std::string(loom::kernels::host::name_of(cpu.best())) + (cpu.avx512_bf16 ? " (avx512_bf16)" : "");
}

}  // namespace bench
