// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file torch/storage.hpp
/// A tensor's memory given back while the tensor — and every view of its storage — keeps its shape and
/// offset, and taken again later (ZeRO-3's whole parameters between gathers: what a forward saved for its
/// backward views the same storage, and sees the next gather's values). `free_storage` leaves the storage
/// 0 bytes long: reading a view of it before `refill_storage` is reading nothing, so only the owner of
/// the storage calls these, around reads it controls. What PyTorch's FSDP does with `storage.resize_(0)`.

#include <ATen/core/Tensor.h>  // at::Tensor

#include <cstddef>  // std::size_t

namespace mpx::detail
{

/// `t`'s storage without memory (0 bytes), its allocation returned to its allocator.
inline void free_storage(const at::Tensor& t)
{
  auto* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

/// `t`'s storage `bytes` long again, from its allocator (nothing when it is that long): the values are
/// whatever the allocator gives until written.
inline void refill_storage(const at::Tensor& t, std::size_t bytes)
{
  auto* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == bytes) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

}  // namespace mpx::detail
