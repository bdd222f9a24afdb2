// Device tags (Host, Cuda) chosen at compile time, and Device, the runtime
// place a tensor's memory lives (kind + ordinal), printed and parsed as
// "host" or "cuda:N".
#pragma once

#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <string>

#include "loom/core/error.hpp"

namespace loom {

enum class DeviceKind : std::uint8_t { host, cuda };

// Where a tensor's bytes are: the host, or CUDA device `index`.
struct Device {
    DeviceKind kind = DeviceKind::host;
    int index = 0;

    friend constexpr bool operator==(const Device&, const Device&) = default;
};

// Compile-time tags: kernels and buffers are specialised on these, so host
// code never names a CUDA type and CUDA code is a separate instantiation.
struct Host {
    static constexpr DeviceKind kind = DeviceKind::host;
};
struct Cuda {
    static constexpr DeviceKind kind = DeviceKind::cuda;
};

template <class T>
concept DeviceTag = requires {
    { T::kind } -> std::convertible_to<DeviceKind>;
};

inline constexpr Device host_device{DeviceKind::host, 0};
inline constexpr Device cuda_device(int index) { return Device{DeviceKind::cuda, index}; }

inline std::ostream& operator<<(std::ostream& out, DeviceKind kind) {
    return out << (kind == DeviceKind::host ? "host" : "cuda");
}

// Prints "host" or "cuda:N".
inline std::ostream& operator<<(std::ostream& out, const Device& device) {
    out << device.kind;
    if (device.kind == DeviceKind::cuda) out << ':' << device.index;
    return out;
}

// "host", "cuda" (cuda:0) or "cuda:N", as a device prints; anything else is
// refused naming the text and what would be valid (no backend is asked
// whether the device exists: check_device_usable does that).
[[nodiscard]] inline Device parse_device(const std::string& text) {
    if (text == "host") return host_device;
    if (text == "cuda") return cuda_device(0);
    char* end = nullptr;
    const long index = text.starts_with("cuda:") ? std::strtol(text.c_str() + 5, &end, 10) : -1;
    if (text.size() > 5 && end != nullptr && *end == '\0' && index >= 0 && index < 1024)
        return cuda_device(static_cast<int>(index));
    throw Error(text + " is not host, cuda or cuda:N (N a device index)");
}

}  // namespace loom
