// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file config.hpp
/// Version macros and the few building blocks every mpx header shares.

#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint64_t
#include <string_view>  // std::string_view

#define MPX_VERSION_MAJOR 0
#define MPX_VERSION_MINOR 1
#define MPX_VERSION_PATCH 0

#define MPX_STRINGIFY_(x) #x
#define MPX_STRINGIFY(x) MPX_STRINGIFY_(x)

namespace mpx
{

/// A string usable as a template argument: `mpx::Reads<"labels">`, `mpx::UserTable<"...">`.
template <std::size_t N>
struct fixed_string
{
  char data[N]{};
  constexpr fixed_string(const char (&s)[N])
  {
    for (std::size_t i = 0; i < N; ++i) data[i] = s[i];
  }
  constexpr std::string_view view() const { return {data, N - 1}; }
  constexpr std::size_t size() const { return N - 1; }
};

namespace detail
{
/// Dependent false for assertions that must fire only on instantiation
/// (our compilers reject a bare `static_assert(false)` in a primary template).
template <class...>
inline constexpr bool dependent_false = false;

/// The compiler's spelling of a type, at compile time. Stable for one compiler and one source tree;
/// used for fingerprints and for printing.
template <class T>
constexpr std::string_view type_name()
{
  std::string_view p = __PRETTY_FUNCTION__;
  auto b = p.find("T = ") + 4;
  auto e = p.find_first_of(";]", b);
  return p.substr(b, e - b);
}

/// FNV-1a, 64 bit: the pipeline fingerprint's hash.
constexpr std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 14695981039346656037ull)
{
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}
constexpr std::uint64_t fnv1a_u64(std::uint64_t v, std::uint64_t h)
{
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xffu)) * 1099511628211ull;
  return h;
}
}  // namespace detail
}  // namespace mpx
