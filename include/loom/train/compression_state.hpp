// A GradCompress run's checkpoint must keep each rank's compressor state
// (error feedback, PowerSGD's warm-start Qs) for an exact resume. That
// state is per rank and means nothing in the serial layout, so it is stored
// as one tensor per world rank, "compression.rank<R>", next to the model,
// with a signature naming the compressor and the degrees it belongs to.
// A resume with the same compressor and degrees takes it back bit for bit;
// any other resume starts the state from zero and says so, since the
// parameters and moments (the serial layout) are all a strategy needs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/parallel/grad_compress.hpp"

namespace loom::train {

inline constexpr const char* compression_metadata_key = "compression";

// "TopK<0.01> on dp 4 x pp 1 x tp 1 x sp 1 (4 ranks)": whose state a checkpoint holds.
[[nodiscard]] inline std::string compression_signature(const Compression& c, int dp, int pp, int tp, int sp) {
    return loom::detail::concat(c.describe(), " on dp ", dp, " x pp ", pp, " x tp ", tp, " x sp ", sp, " (",
                                dp * pp * tp * sp, " ranks)");
}

[[nodiscard]] inline std::string compression_tensor_name(int rank) {
    return "compression.rank" + std::to_string(rank);
}

// Collective over `world`: every rank's state, as tensors for the lead's
// checkpoint (`storage` keeps their memory; empty on other ranks).
template <comm::Communicator C>
[[nodiscard]] std::vector<io::NamedTensor> gather_compression_states(C& world, std::span<const float> mine,
                                                                     std::vector<Buffer<Host>>& storage) {
    const int n = world.size();
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(n));
    std::int64_t my_size = static_cast<std::int64_t>(mine.size());
    world.all_gather(Tensor::of(&my_size, {1}), Tensor::of(sizes.data(), {n}));
    const std::int64_t longest = std::max<std::int64_t>(1, *std::max_element(sizes.begin(), sizes.end()));
    std::vector<float> padded(static_cast<std::size_t>(longest), 0.0f), all(static_cast<std::size_t>(longest * n));
    std::copy(mine.begin(), mine.end(), padded.begin());
    world.all_gather(Tensor::of(padded.data(), {longest}), Tensor::of(all.data(), {longest * n}));
    std::vector<io::NamedTensor> tensors;
    if (world.rank() != 0) return tensors;
    storage.clear();
    for (int r = 0; r < n; ++r) {
        const std::int64_t size = sizes[static_cast<std::size_t>(r)];
        if (size == 0) continue;
        storage.emplace_back(DType::f32, Shape{size});
        std::copy_n(all.begin() + r * longest, size, storage.back().data<float>());
        tensors.push_back({compression_tensor_name(r), Tensor::of(storage.back().data<float>(), {size})});
    }
    return tensors;
}

// This rank's saved state into `out` when the checkpoint holds one for the
// same signature; false (and `why` says so) otherwise.
[[nodiscard]] inline bool read_compression_state(const std::filesystem::path& path, const std::string& signature,
                                                 int rank, std::span<float> out, std::string& why) {
    const io::SafetensorsFile file(path);
    const std::optional<std::string_view> saved = file.metadata().find(compression_metadata_key);
    if (!saved) {
        why = "the checkpoint has no compressor state (saved without GradCompress)";
        return false;
    }
    if (*saved != signature) {
        why = "the checkpoint's compressor state belongs to " + std::string(*saved) + ", not " + signature;
        return false;
    }
    const std::string name = compression_tensor_name(rank);
    if (out.empty()) return true;
    LOOM_CHECK(file.contains(name), "checkpoint ", path.string(), " says it holds the state of ", signature,
               " but has no ", name);
    const Tensor t = file.tensor(name);
    LOOM_CHECK(t.numel() == static_cast<std::int64_t>(out.size()), "checkpoint ", path.string(), ": ", name, " has ",
               t.numel(), " elements; this rank's compressor state has ", out.size());
    file.read_into(name, Tensor::of(out.data(), {static_cast<std::int64_t>(out.size())}));
    return true;
}

}  // namespace loom::train
