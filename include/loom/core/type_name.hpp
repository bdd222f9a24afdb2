// Readable names of C++ types, for messages and reports: typeid's name is
// mangled on GCC and clang ("5Swish"), which tells a user nothing. A layer may
// also say its own name (`static constexpr std::string_view name = "Swish";`),
// which wins over the demangled one.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>

#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#define LOOM_HAVE_CXXABI 1
#endif

namespace loom {

// "loom::gpt::Block", "Swish", "loom::nn::Residual<loom::nn::LayerNorm, ...>":
// the demangled name where the ABI offers a demangler, else typeid's own.
template <class T>
[[nodiscard]] std::string demangled_name() {
    std::string full = typeid(T).name();
#ifdef LOOM_HAVE_CXXABI
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(full.c_str(), nullptr, nullptr, &status),
                                                     std::free);
    if (status == 0 && demangled) full = demangled.get();
#endif
    return full;
}

// "loom::gpt::Block" -> "Block": the last component of the demangled name,
// template arguments dropped.
template <class T>
[[nodiscard]] std::string short_type_name() {
    std::string full = demangled_name<T>();
    if (const auto angle = full.find('<'); angle != std::string::npos) full.resize(angle);
    if (const auto colon = full.rfind("::"); colon != std::string::npos) full.erase(0, colon + 2);
    return full;
}

// Whether T says its own name: a static constexpr std::string_view `name`
// (a non-static `name` field, a config string, does not count).
template <class T>
concept DeclaresName = requires { requires std::is_same_v<decltype(T::name), const std::string_view>; };

// What messages call a layer: its declared name, else its demangled type name
// (`full`: with namespaces and template arguments; else the short form).
template <class T>
[[nodiscard]] std::string layer_name(bool full = false) {
    if constexpr (DeclaresName<T>) return std::string(T::name);
    else return full ? demangled_name<T>() : short_type_name<T>();
}

}  // namespace loom
