// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/torch/tensor.hpp: LibTorch modules and tensors in pipeline types.
#include "support/catch_torch.hpp"

#include <mpx/mpx.hpp>

#include <boost/hana/define_struct.hpp>
#include <torch/torch.h>

namespace
{
struct Features
{
  BOOST_HANA_DEFINE_STRUCT(Features, (torch::Tensor, hidden), (torch::Tensor, mask));
};

struct EncoderImpl : torch::nn::Module
{
  EncoderImpl() : fc(register_module("fc", torch::nn::Linear(4, 8))) {}
  Features forward(torch::Tensor x) { return {fc(x), torch::ones({x.size(0)}, torch::kLong)}; }
  torch::nn::Linear fc;
};
TORCH_MODULE(Encoder);

struct HeadImpl : torch::nn::Module
{
  HeadImpl() : fc(register_module("fc", torch::nn::Linear(8, 2))) {}
  torch::Tensor forward(const Features& f) { return fc(f.hidden); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Head);

using P = mpx::Pipeline<mpx::Stage<Encoder, mpx::CPU<0>>, mpx::Stage<Head, mpx::CPU<1>, mpx::Optimizer<mpx::AdamW>>,
                        mpx::Microbatches<4>>;
}  // namespace

TEST_CASE("torch::Tensor and Hana structs of tensors are boundaries", "[torch][static]")
{
  STATIC_REQUIRE(mpx::TensorLike<torch::Tensor>);
  STATIC_REQUIRE(mpx::Boundary<torch::Tensor>);
  STATIC_REQUIRE(mpx::Boundary<Features>);
}

TEST_CASE("TORCH_MODULE holders are stage modules", "[torch][static]")
{
  STATIC_REQUIRE(mpx::StageModule<Encoder>);
  STATIC_REQUIRE(std::is_same_v<mpx::module_traits<Encoder>::output_type, Features>);
  STATIC_REQUIRE(std::is_same_v<mpx::module_traits<Head>::input_type, Features>);
  STATIC_REQUIRE(mpx::proof_v<P>.ok());
}

TEST_CASE("The modules are ordinary single-device LibTorch code", "[torch]")
{
  Encoder enc;
  Head head;
  const auto out = head->forward(enc->forward(torch::randn({3, 4})));
  CHECK(out.sizes() == torch::IntArrayRef({3, 2}));
}
