// Mesh: the world's ranks arranged on named axes (dp, pp, tp, sp, and any a
// policy adds), with one sub-communicator per axis: mesh.axis("tp") is the
// group of ranks that differ from this one only in their tp coordinate.
//
// Rank order: tp is innermost (neighbouring ranks share a tp group, which
// keeps the chattiest traffic inside a node), then sp, then any other axes in
// the order given, then dp, and pp outermost:
//   world rank = (((pp * dp_size + dp) * others... ) * sp_size + sp) * tp_size + tp
// The four standard axes always exist; one not given has size 1.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

struct MeshAxis {
    std::string name;
    int size = 1;
};

namespace detail {

// Outer-to-inner position of a standard axis; other axes sit between dp and sp.
[[nodiscard]] inline int standard_axis_order(std::string_view name) {
    if (name == "pp") return 0;
    if (name == "dp") return 1;
    if (name == "sp") return 3;
    if (name == "tp") return 4;
    return 2;
}

// The axes in rank order (outermost first), the standard four always present.
[[nodiscard]] inline std::vector<MeshAxis> ordered_axes(const std::vector<MeshAxis>& given) {
    std::vector<MeshAxis> axes;
    for (const auto& axis : given) {
        LOOM_CHECK(!axis.name.empty(), "Mesh: an axis has an empty name; name it (dp, pp, tp, sp, or your own)");
        LOOM_CHECK(axis.size >= 1, "Mesh: axis ", axis.name, " has size ", axis.size, "; sizes are 1 or more");
        for (const auto& seen : axes)
            LOOM_CHECK(seen.name != axis.name, "Mesh: axis ", axis.name, " is given twice");
        axes.push_back(axis);
    }
    for (std::string_view standard : {"pp", "dp", "sp", "tp"}) {
        bool present = false;
        for (const auto& axis : axes) present = present || axis.name == standard;
        if (!present) axes.push_back({std::string(standard), 1});
    }
    std::stable_sort(axes.begin(), axes.end(), [](const MeshAxis& a, const MeshAxis& b) {
        return standard_axis_order(a.name) < standard_axis_order(b.name);
    });
    return axes;
}

}  // namespace detail

template <Communicator C>
class Mesh {
public:
    // Collective: every rank of `world` constructs its Mesh with the same axes
    // (one split per axis). `world` must outlive the mesh.
    Mesh(C& world, const std::vector<MeshAxis>& axes) : world_(&world), axes_(detail::ordered_axes(axes)) {
        std::int64_t product = 1;
        for (const auto& axis : axes_) product *= axis.size;
        LOOM_CHECK(product == world.size(), "Mesh ", describe(axes_), " has ", product, " ranks but the world has ",
                   world.size(), "; the axis sizes must multiply to the world size");
        // Coordinates of this rank, innermost axis varying fastest.
        int rest = world.rank();
        coordinates_.assign(axes_.size(), 0);
        for (std::size_t i = axes_.size(); i-- > 0;) {
            coordinates_[i] = rest % axes_[i].size;
            rest /= axes_[i].size;
        }
        // One group per axis: same coordinates on every other axis.
        for (std::size_t i = 0; i < axes_.size(); ++i) {
            int color = 0;
            for (std::size_t j = 0; j < axes_.size(); ++j)
                if (j != i) color = color * axes_[j].size + coordinates_[j];
            groups_.push_back(world.split(color, coordinates_[i]));
        }
    }

    [[nodiscard]] C& world() const noexcept { return *world_; }
    [[nodiscard]] const std::vector<MeshAxis>& axes() const noexcept { return axes_; }

    // The communicator of this rank's group along `name`.
    [[nodiscard]] C& axis(std::string_view name) { return groups_[index(name)]; }
    [[nodiscard]] int size(std::string_view name) const { return axes_[index(name)].size; }
    [[nodiscard]] int coordinate(std::string_view name) const { return coordinates_[index(name)]; }
    [[nodiscard]] bool has(std::string_view name) const {
        for (const auto& axis : axes_)
            if (axis.name == name) return true;
        return false;
    }

    // The group of ranks that differ from this one only along the named axes
    // (together): combined({"dp", "sp"}) reduces gradients over data and
    // sequence parallelism at once. Collective over the world the first time
    // for a given list (every rank must ask in the same order); kept after.
    [[nodiscard]] C& combined(const std::vector<std::string>& names) {
        std::string key;
        for (const auto& name : names) key += name + ",";
        for (auto& [k, group] : combined_)
            if (k == key) return group;
        std::vector<bool> inside(axes_.size(), false);
        for (const auto& name : names) inside[index(name)] = true;
        int color = 0, order = 0;
        for (std::size_t j = 0; j < axes_.size(); ++j) {
            if (inside[j]) order = order * axes_[j].size + coordinates_[j];
            else color = color * axes_[j].size + coordinates_[j];
        }
        combined_.emplace_back(key, world_->split(color, order));
        return combined_.back().second;
    }

    // The world rank at the given coordinates (axes not named: this rank's).
    [[nodiscard]] int world_rank(const std::vector<std::pair<std::string, int>>& at) const {
        std::vector<int> coordinates = coordinates_;
        for (const auto& [name, value] : at) {
            const std::size_t i = index(name);
            LOOM_CHECK(value >= 0 && value < axes_[i].size, "Mesh: coordinate ", name, "=", value,
                       " is outside 0..", axes_[i].size - 1);
            coordinates[i] = value;
        }
        int rank = 0;
        for (std::size_t i = 0; i < axes_.size(); ++i) rank = rank * axes_[i].size + coordinates[i];
        return rank;
    }

    [[nodiscard]] static std::string describe(const std::vector<MeshAxis>& axes) {
        std::ostringstream out;
        out << "Mesh(";
        for (std::size_t i = 0; i < axes.size(); ++i) out << (i ? " x " : "") << axes[i].name << "=" << axes[i].size;
        out << ")";
        return out.str();
    }

    friend std::ostream& operator<<(std::ostream& out, const Mesh& mesh) { return out << describe(mesh.axes_); }

private:
    [[nodiscard]] std::size_t index(std::string_view name) const {
        for (std::size_t i = 0; i < axes_.size(); ++i)
            if (axes_[i].name == name) return i;
        std::string names;
        for (const auto& axis : axes_) names += (names.empty() ? "" : ", ") + axis.name;
        LOOM_FAIL("Mesh has no axis '", name, "'; its axes are ", names);
    }

    C* world_;
    std::vector<MeshAxis> axes_;
    std::vector<int> coordinates_;
    std::vector<C> groups_;
    std::deque<std::pair<std::string, C>> combined_;  // a deque: references stay valid
};

}  // namespace loom::comm
