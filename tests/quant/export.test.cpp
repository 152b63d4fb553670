// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/quant/export.hpp: whole weights packed, written to safetensors, read back and held by a fresh
// model's linears give the outputs of the weights' round trip, in every format; a packed file holds the
// documented tensors and sizes; an incomplete or mismatched file is a named error.
#include "support/catch_torch.hpp"
#include "support/tiny_tp_transformer.hpp"

#include <mpx/io/safetensors.hpp>
#include <mpx/quant/export.hpp>

#include <filesystem>
#include <set>

namespace q = mpx::quant;

namespace
{
const tiny::Config export_config{32, 16, 4, 2, 8};

std::map<std::string, at::Tensor> weights_of(torch::nn::Module& m)
{
  std::map<std::string, at::Tensor> out;
  for (auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

std::set<std::string> linear_weights(const std::map<std::string, at::Tensor>& w)
{
  std::set<std::string> out;
  for (const auto& [n, t] : w)
    if (n.ends_with("qkv.weight") || n.ends_with("proj.weight") || n.ends_with("fc1.weight") || n.ends_with("fc2.weight") || n == "head.weight")
      out.insert(n);
  return out;
}
}  // namespace

TEST_CASE("A packed export read back runs in a fresh model as the weights' round trip, in every format", "[quant]")
{
  torch::manual_seed(8);
  tiny_tp::Model trained(export_config, 0, export_config.layers);
  const auto whole = weights_of(*trained);
  const auto which = linear_weights(whole);
  REQUIRE(which.size() == std::size_t(4 * export_config.layers + 1));
  const auto batch = tiny::make_batch(export_config, 4, 0, 0, 1);
  const auto path = (std::filesystem::temp_directory_path() / ("mpx-quant-export-" + std::to_string(::getpid()) + ".safetensors")).string();
  for (const char* f : {"int8", "int4", "int4/g8", "nf4/g8", "bf16"}) {
    INFO(f);
    const auto packed = q::pack_weights(whole, which, q::parse(f));
    CHECK(!packed.count("blocks.0.qkv.weight"));
    CHECK(packed.at("blocks.0.qkv.weight.shape").equal(torch::tensor({48L, 16L})));
    mpx::save_safetensors(path, packed, {{"quantization", f}});
    const auto file = mpx::load_safetensors(path);
    const auto read = q::read_packed(file.tensors, file.metadata.at("quantization"));
    CHECK(read.packed.size() == which.size());
    CHECK(read.plain.size() == whole.size() - which.size());
    // the reference: the weights' round trip in a plain model
    torch::manual_seed(9);
    tiny_tp::Model reference(export_config, 0, export_config.layers);
    {
      torch::NoGradGuard ng;
      for (auto& p : reference->named_parameters())
        p.value().copy_(which.count(p.key()) ? q::round_trip(whole.at(p.key()), q::parse(f)) : whole.at(p.key()));
    }
    torch::manual_seed(10);
    tiny_tp::Model fresh(export_config, 0, export_config.layers);
    {
      torch::NoGradGuard ng;
      for (auto& p : fresh->named_parameters())
        if (read.plain.count(p.key())) p.value().copy_(read.plain.at(p.key()));
    }
    CHECK(q::install_packed(*fresh, read.packed).size() == which.size());
    CHECK(fresh->blocks->ptr(0)->named_parameters().find("fc1.weight")->numel() == 0);
    CHECK(torch::allclose(fresh(batch.tokens), reference(batch.tokens), 1e-5, 1e-6));
  }
  std::filesystem::remove(path);
}

TEST_CASE("An incomplete or mismatched packed export is a named error", "[quant]")
{
  torch::manual_seed(8);
  tiny_tp::Model m(export_config, 0, export_config.layers);
  const auto whole = weights_of(*m);
  const auto packed = q::pack_weights(whole, {"blocks.0.fc1.weight"}, q::parse("int4/g8"));
  CHECK_THROWS_WITH(q::pack_weights(whole, {"nothing.weight"}, q::parse("int8")), Catch::Contains("no weight nothing.weight"));
  auto without = packed;
  without.erase("blocks.0.fc1.weight.scales");
  CHECK_THROWS_WITH(q::read_packed(without, "int4/g8"), Catch::Contains("blocks.0.fc1.weight lacks"));
  CHECK_THROWS_WITH(q::read_packed(packed, "int4/g4"), Catch::Contains("scales per row"));
  CHECK_THROWS_WITH(q::read_packed(packed, "int8"), Catch::Contains("do not fit"));
  CHECK_THROWS_WITH(q::read_packed(packed, "int5"), Catch::Contains("unknown format"));
  auto read = q::read_packed(packed, "int4/g8");
  read.packed["blocks.9.fc1.weight"] = read.packed.at("blocks.0.fc1.weight");
  CHECK_THROWS_WITH(q::install_packed(*m, read.packed), Catch::Contains("blocks.9.fc1.weight is packed, but the model has no mpx linear"));
  auto other = q::read_packed(q::pack_weights(whole, {"blocks.0.fc2.weight"}, q::parse("int4/g8")), "int4/g8");
  tiny_tp::Model fresh(export_config, 0, export_config.layers);
  std::map<std::string, q::Packed> swapped{{"blocks.0.fc1.weight", other.packed.at("blocks.0.fc2.weight")}};
  CHECK_THROWS_WITH(q::install_packed(*fresh, swapped), Catch::Contains("for a linear of"));
}
