// Reflection over user layer types: enumerate a layer's fields in declaration
// order with Boost.PFR (or the loom_fields customisation point), and walk a
// model recursively to find every nested layer and every Param.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// GCC's std::tr2::direct_bases detects base classes (nvcc's front end accepts
// it too); clang cannot parse it, and there PFR's own assertion remains.
#if defined(__GNUC__) && !defined(__clang__) && __has_include(<tr2/type_traits>)
#include <tr2/type_traits>
#define LOOM_HAS_DIRECT_BASES 1
#endif

#include <boost/pfr/core.hpp>

#include "loom/core/device.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/param.hpp"
#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"

namespace loom {

// Field types that are configuration, not layers: reflection skips them.
// Specialise to true for your own non-layer field types (opt-out 2 of 2).
template <class T>
inline constexpr bool is_config_field =
    std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_pointer_v<T> || std::is_same_v<T, std::string> ||
    std::is_same_v<T, std::string_view> || std::is_same_v<T, Extents> || std::is_same_v<T, DType> ||
    std::is_same_v<T, Device> || std::is_same_v<T, Init> || std::is_same_v<T, Tensor> || std::is_same_v<T, bf16> ||
    std::is_same_v<T, f16>;

namespace reflect {

namespace detail {

template <class>
inline constexpr bool dependent_false = false;

// Poison pill: makes `loom_fields(x)` below an ADL-only lookup.
void loom_fields() = delete;

template <class T>
concept HasMemberFields = requires(T& t) { t.loom_fields(); };

template <class T>
concept HasFreeFields = requires(T& t) { loom_fields(t); };

template <class T>
struct sequence_traits : std::false_type {};
template <class T, class A>
struct sequence_traits<std::vector<T, A>> : std::true_type {
    using element = T;
};
template <class T, std::size_t N>
struct sequence_traits<std::array<T, N>> : std::true_type {
    using element = T;
};

template <class T>
constexpr bool has_base_classes() {
#ifdef LOOM_HAS_DIRECT_BASES
    if constexpr (std::is_class_v<T>) return !std::tr2::direct_bases<T>::type::empty::value;
#endif
    return false;
}

}  // namespace detail

// A std::vector or std::array of layers: each element is walked in order.
template <class T>
concept LayerSequence = detail::sequence_traits<std::remove_cv_t<T>>::value;

template <class T>
concept ParamField = std::is_same_v<std::remove_cv_t<T>, Param>;

// True for fields that are skipped: configuration values, and sequences of them.
template <class T>
constexpr bool is_config() {
    using U = std::remove_cv_t<T>;
    if constexpr (is_config_field<U>) return true;
    else if constexpr (LayerSequence<U>) return is_config<typename detail::sequence_traits<U>::element>();
    else return false;
}

// True when T's fields come from the loom_fields customisation point.
template <class T>
inline constexpr bool has_custom_fields = detail::HasMemberFields<T> || detail::HasFreeFields<T>;

// True when Boost.PFR can enumerate T's fields: an aggregate with no base
// classes and no virtual functions (user constructors make a type non-aggregate).
template <class T>
inline constexpr bool pfr_reflectable = std::is_class_v<T> && std::is_aggregate_v<T> &&
                                        !std::is_polymorphic_v<T> && !detail::has_base_classes<T>();

// Calls f(field, index) for each field of `layer` in declaration order. The
// fields are those loom_fields returns when T customises it, else PFR's.
template <class T, class F>
void for_each_field(T& layer, F&& f) {
    using U = std::remove_cv_t<T>;
    auto& mutable_layer = const_cast<U&>(layer);
    auto call = [&](auto& field, std::size_t index) {
        if constexpr (std::is_const_v<T>) f(std::as_const(field), index);
        else f(field, index);
    };
    auto apply_tuple = [&](auto&& fields) {
        std::apply([&](auto&... each) {
            std::size_t index = 0;
            (call(each, index++), ...);
        }, fields);
    };
    if constexpr (detail::HasMemberFields<U>) {
        apply_tuple(mutable_layer.loom_fields());
    } else if constexpr (detail::HasFreeFields<U>) {
        using detail::loom_fields;
        apply_tuple(loom_fields(mutable_layer));
    } else if constexpr (pfr_reflectable<U>) {
        boost::pfr::for_each_field(mutable_layer, [&](auto& field, std::size_t index) { call(field, index); });
    } else {
        static_assert(detail::dependent_false<U>,
                      "loom cannot reflect this layer type: Boost.PFR enumerates only aggregates with no base "
                      "classes, no user-declared constructors and no virtual functions. Make it such an "
                      "aggregate, or give it a member `auto loom_fields() { return std::tie(field1, field2); }` "
                      "listing its layers and Params in order, or mark a non-layer field type as "
                      "configuration with `template <> inline constexpr bool loom::is_config_field<T> = true;`");
    }
}

namespace detail {

// Appends ".index" (or "index" at the root) to `path` for one nested step.
class PathScope {
public:
    PathScope(std::string& path, std::size_t index) : path_(path), size_(path.size()) {
        if (!path_.empty()) path_ += '.';
        path_ += std::to_string(index);
    }
    PathScope(const PathScope&) = delete;
    PathScope& operator=(const PathScope&) = delete;
    ~PathScope() { path_.resize(size_); }

private:
    std::string& path_;
    std::size_t size_;
};

template <class T, class OnParam, class OnLayer>
void walk(T& node, std::string& path, OnParam& on_param, OnLayer& on_layer) {
    using U = std::remove_cv_t<T>;
    if constexpr (ParamField<U>) {
        on_param(node, std::string_view(path));
    } else if constexpr (is_config<U>()) {
        // configuration: nothing to find inside
    } else if constexpr (LayerSequence<U>) {
        std::size_t index = 0;
        for (auto& element : node) {
            PathScope scope(path, index++);
            walk(element, path, on_param, on_layer);
        }
    } else {
        on_layer(node, std::string_view(path));
        for_each_field(node, [&](auto& field, std::size_t index) {
            PathScope scope(path, index);
            walk(field, path, on_param, on_layer);
        });
    }
}

}  // namespace detail

// Calls f(param, path) for every Param in `model`, depth first in field order.
// Paths are field indices joined by '.', e.g. "3.1.0" (Boost 1.81's PFR has
// no field names); they are stable for a given model type and depth.
template <class Model, class F>
void visit_params(Model& model, F&& f) {
    std::string path;
    auto ignore_layer = [](auto&, std::string_view) {};
    detail::walk(model, path, f, ignore_layer);
}

// Calls f(layer, path) for `model` itself and every nested layer, pre-order.
template <class Model, class F>
void visit_layers(Model& model, F&& f) {
    std::string path;
    auto ignore_param = [](auto&, std::string_view) {};
    detail::walk(model, path, ignore_param, f);
}

// How many Params `model` holds.
template <class Model>
[[nodiscard]] std::size_t param_count(const Model& model) {
    std::size_t count = 0;
    visit_params(model, [&](const Param&, std::string_view) { ++count; });
    return count;
}

// How many scalar parameters (elements over all Params) `model` holds.
template <class Model>
[[nodiscard]] std::int64_t parameter_numel(const Model& model) {
    std::int64_t total = 0;
    visit_params(model, [&](const Param& p, std::string_view) { total += p.numel(); });
    return total;
}

}  // namespace reflect
}  // namespace loom
