// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire.hpp
/// What crosses a stage boundary, and how: a boundary value (a tensor, or a Hana struct of tensors) travels
/// as one header and its tensors. Over Gloo the tensors usually travel in the header's message (packed,
/// one message per boundary value); a value larger than the receive's capacity, and every value over NCCL,
/// sends its header, then one message per tensor. The rooms (one header each, one concept each):
///
/// | header | what |
/// |---|---|
/// | `wire/format.hpp`   | the header's layout, tags, `Expect`, `ChannelSize`; `encode_header` / `read_header` (checked) |
/// | `wire/send.hpp`     | `send_tensors`, `PendingSend` |
/// | `wire/receive.hpp`  | `post_recv`, `finish_recv`, `PendingRecv` |
/// | `wire/receiver.hpp` | `Receiver`: the one thread that receives a channel's messages as on NCCL |

#include <mpx/runtime/wire/boundary_value.hpp>  // mpx::detail::flatten, unflatten, field_names
#include <mpx/runtime/wire/format.hpp>     // mpx::Expect, mpx::ChannelSize
#include <mpx/runtime/wire/receive.hpp>    // mpx::post_recv, mpx::finish_recv, mpx::PendingRecv
#include <mpx/runtime/wire/receiver.hpp>   // mpx::Receiver
#include <mpx/runtime/wire/send.hpp>       // mpx::send_tensors, mpx::PendingSend
