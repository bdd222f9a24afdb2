// Device tags (Host, Cuda) chosen at compile time, and Device, the runtime
// place a tensor's memory lives (kind + ordinal).
#pragma once

#include <concepts>
#include <cstdint>
#include <ostream>
#include <string>

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

}  // namespace loom
