// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file device.hpp
/// Device tags: `GPU<i>` (local CUDA device i) and `CPU<i>` (a CPU rank). The index is the pipeline
/// *slot*: the pipeline rank, among the ranks of one replica, that runs the stage.
///
/// Concept `Device` — minimal complete definition: a specialisation of `mpx::device_traits<T>` with
/// `static constexpr DeviceKind kind` and `static constexpr int index`. Models: `GPU<i>`, `CPU<i>`.

#include <mpx/config.hpp>  // mpx::detail::dependent_false

#include <concepts>  // std::same_as

namespace mpx
{

/// Which hardware a device tag names.
enum class DeviceKind { cpu, cuda };

/// Local CUDA device `Index` (also the pipeline slot). Without CUDA a run stops, naming the fix, unless
/// the program opted into CPU (see docs/05_running.md).
template <int Index>
struct GPU
{
  static_assert(Index >= 0, "mpx::GPU<Index>: Index must be >= 0 (it is the local CUDA device and pipeline slot)");
};

/// A CPU rank at pipeline slot `Index`, for CPU-only pipelines and tests.
template <int Index = 0>
struct CPU
{
  static_assert(Index >= 0, "mpx::CPU<Index>: Index must be >= 0 (it is the pipeline slot)");
};

/// Traits of a device tag. The primary template is not a device.
template <class T>
struct device_traits
{
  static constexpr bool is_device = false;
};

template <int I>
struct device_traits<GPU<I>>
{
  static constexpr bool is_device = true;
  static constexpr DeviceKind kind = DeviceKind::cuda;
  static constexpr int index = I;
  static constexpr const char* name = "GPU";
};

template <int I>
struct device_traits<CPU<I>>
{
  static constexpr bool is_device = true;
  static constexpr DeviceKind kind = DeviceKind::cpu;
  static constexpr int index = I;
  static constexpr const char* name = "CPU";
};

/// Concept: a device tag such as `mpx::GPU<0>` or `mpx::CPU<1>`.
template <class T>
concept Device = device_traits<T>::is_device && requires {
  { device_traits<T>::kind } -> std::convertible_to<DeviceKind>;
  { device_traits<T>::index } -> std::convertible_to<int>;
};

/// The slot (pipeline rank within a replica) of a device tag.
template <Device D>
inline constexpr int slot_v = device_traits<D>::index;

}  // namespace mpx
