// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/wire/*.hpp in one process: a header written by the sending end is read back by the
// receiving end (packed: the receiver's tensors are views of the message), and a malformed header is a
// named peer_error, never a crash (dtype codes, ranks, negative extents, sizes that would overflow).
#include "support/rooms.hpp"

#include <cstring>
#include <limits>
#include <random>

namespace
{
mpx::Expect pair_expect() { return mpx::Expect{1, 3, false, {"a", "b"}, "Pair"}; }

/// The packed message `send_tensors` would send for `ts`.
at::Tensor packed_message(const std::vector<at::Tensor>& ts, at::ScalarType wire = at::kFloat)
{
  auto m = mpx::detail::make_message(1, 3, false, ts, wire, torch::kCPU);
  m.header.data_ptr<std::int64_t>()[5] = m.bytes;
  return mpx::detail::pack_message(m);
}

std::vector<at::Tensor> receive(const at::Tensor& msg, mpx::Expect e = pair_expect())
{
  mpx::PendingRecv r;
  r.header = msg;
  r.expect = std::move(e);
  r.what = "RF3 of stage 1 from slot 0";
  mpx::ProcessGroupPtr none;  // a packed message needs no further receive
  mpx::detail::post_payloads(none, r);
  return mpx::finish_recv(none, r, std::chrono::milliseconds(1000));
}

std::int64_t* header_of(at::Tensor& msg) { return reinterpret_cast<std::int64_t*>(msg.data_ptr()); }
std::int64_t* field(at::Tensor& msg, int i) { return header_of(msg) + mpx::detail::header_fixed + i * mpx::detail::header_per_field; }
}  // namespace

TEST_CASE("A packed message reads back exactly: values, dtypes, requires_grad, an absent field", "[rooms][wire]")
{
  auto a = torch::arange(12, torch::kFloat).reshape({4, 3}).requires_grad_(true);
  auto got = receive(packed_message({a, at::Tensor()}));
  REQUIRE(got.size() == 2);
  CHECK(torch::equal(got[0], a.detach()));
  CHECK(got[0].requires_grad());
  CHECK(!got[1].defined());
  auto bf = receive(packed_message({a, torch::arange(5, torch::kLong)}, at::kBFloat16));  // floats in bf16, integers as they are
  CHECK(bf[0].scalar_type() == at::kFloat);
  CHECK(torch::equal(bf[0], a.detach()));  // small integers are exact in bf16
  CHECK(bf[1].scalar_type() == at::kLong);
}

TEST_CASE("A header that breaks the boundary or its own format is a named peer_error", "[rooms][wire]")
{
  const auto good = packed_message({torch::ones({4, 3}), torch::ones({5})});
  auto broken = [&](auto edit) {
    auto m = good.clone();
    edit(m);
    return m;
  };
  using Catch::Contains;
  CHECK_THROWS_WITH(receive(broken([](at::Tensor& m) { header_of(m)[0] = 7; })), Contains("not an mpx boundary header"));
  CHECK_THROWS_WITH(receive(broken([](at::Tensor& m) { header_of(m)[2] = 2; })), Contains("micro-batch 2 where the schedule expects"));
  CHECK_THROWS_WITH(receive(broken([](at::Tensor& m) { header_of(m)[3] = -5; })), Contains("has 2 fields but the message has -5"));
  CHECK_THROWS_WITH(receive(broken([](at::Tensor& m) { field(m, 0)[0] = 999; })), Contains("field 'a' has dtype codes 999"));
  CHECK_THROWS_WITH(receive(broken([](at::Tensor& m) { field(m, 1)[1] = -3; })), Contains("field 'b' has dtype codes"));
  CHECK_THROWS_WITH(receive(broken([](at::Tensor& m) { field(m, 0)[3] = 9; })), Contains("invalid rank 9"));
  CHECK_THROWS_WITH(receive(broken([](at::Tensor& m) { field(m, 0)[4] = -1; })), Contains("negative extent"));
  // [2^61 + 1] float32 would wrap to a few bytes in unchecked int64 arithmetic
  CHECK_THROWS_WITH(receive(broken([](at::Tensor& m) { field(m, 1)[4] = (std::int64_t(1) << 61) + 1; })), Contains("declares more than"));
  CHECK_THROWS_WITH(receive(broken([](at::Tensor& m) { field(m, 1)[4] = 500; })), Contains("payload bytes, the message packs"));
  CHECK_THROWS_WITH(receive(broken([](at::Tensor& m) { header_of(m)[5] = 1 << 20; })), Contains("the receive had room for"));
  CHECK_THROWS_AS(receive(broken([](at::Tensor& m) { field(m, 0)[2] = 4; })), mpx::peer_error);
}

TEST_CASE("A field of another shape than its boundary declares is a peer_error naming stage, field and both shapes", "[rooms][wire]")
{
  const auto msg = packed_message({torch::ones({4, 3}), torch::ones({5})});
  auto declared = [](std::vector<std::optional<std::vector<std::int64_t>>> dims) {
    auto e = pair_expect();
    e.dims = std::move(dims);
    return e;
  };
  CHECK(receive(msg, declared({std::vector<std::int64_t>{mpx::any, 3}, std::nullopt})).size() == 2);  // any extent, an undeclared field
  CHECK(receive(msg, declared({std::vector<std::int64_t>{4, 3}, std::vector<std::int64_t>{5}})).size() == 2);
  using Catch::Contains;
  CHECK_THROWS_WITH(receive(msg, declared({std::vector<std::int64_t>{mpx::any, mpx::any, 3}})),
                    Contains("field 'a' of stage 1 has shape [4, 3] but the boundary Pair declares [any, any, 3] (rank 2, declared 3)"));
  CHECK_THROWS_WITH(receive(msg, declared({std::nullopt, std::vector<std::int64_t>{6}})),
                    Contains("field 'b' of stage 1 has shape [5] but the boundary Pair declares [6]"));
  CHECK_THROWS_AS(receive(msg, declared({std::vector<std::int64_t>{4, 2}})), mpx::peer_error);
}

TEST_CASE("The sender refuses a boundary the header cannot describe, naming the fix", "[rooms][wire]")
{
  std::vector<at::Tensor> many(17, torch::ones({1}));
  CHECK_THROWS_WITH(mpx::detail::wire_tensors(many, 1, at::kFloat, torch::kCPU), Catch::Contains("group them into fewer tensors"));
  CHECK_THROWS_WITH(mpx::detail::wire_tensors({torch::ones(std::vector<std::int64_t>(9, 1))}, 1, at::kFloat, torch::kCPU),
                    Catch::Contains("reshape it"));
}

TEST_CASE("2,000 seeded mutations of real headers: each is read back or refused with a peer_error, nothing else", "[rooms][wire][fuzz]")
{
  // real messages (floats, bf16 on the wire, integers, an absent field, an empty tensor), then per mutation:
  // random bit flips, random bytes, or an int64 field set to an extreme value
  const std::vector<at::Tensor> seeds[] = {
      {torch::arange(12, torch::kFloat).reshape({4, 3}), torch::ones({5})},
      {torch::ones({2, 3, 4}), at::Tensor()},
      {torch::zeros({0, 3}), torch::arange(5, torch::kLong)},
  };
  const std::int64_t extremes[] = {-1, 0, 1, 8, 9, 17, 255, std::int64_t(1) << 31, std::int64_t(1) << 61, (std::int64_t(1) << 62) + 1,
                                   std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()};
  std::mt19937_64 rng(20261201);
  int read_back = 0, refused = 0;
  for (int k = 0; k < 2000; ++k) {
    const auto& seed = seeds[k % 3];
    auto msg = packed_message(seed, k % 2 ? at::kBFloat16 : at::kFloat);
    auto* words = header_of(msg);
    auto* bytes = msg.data_ptr<std::uint8_t>();
    const int kind = int(rng() % 3), n = 1 + int(rng() % 4);
    for (int j = 0; j < n; ++j) {
      const auto word = std::size_t(rng() % mpx::detail::header_size);
      if (kind == 0) bytes[word * 8 + rng() % 8] ^= std::uint8_t(1u << (rng() % 8));
      else if (kind == 1) bytes[rng() % std::size_t(msg.numel())] = std::uint8_t(rng());
      else words[word] = extremes[rng() % std::size(extremes)];
    }
    const mpx::Expect e = pair_expect();
    try {
      const auto capacity = std::int64_t(msg.nbytes()) - mpx::detail::header_bytes;
      const auto h = mpx::detail::read_header(words, capacity, e, "fuzzed message");
      if (h.packed >= 0) CHECK(receive(msg, e).size() == 2);  // else its payloads would follow as messages of their own
      ++read_back;
    } catch (const mpx::peer_error&) {
      ++refused;
    }
  }
  CHECK(read_back + refused == 2000);
  CHECK(refused > 200);  // many mutations break the header (most words are the unused fields and dims)
  CHECK(read_back > 0);   // some touch only payload bytes or unused words
}
