// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/stage_optimizers.hpp: built from the policies (none for a frozen stage), stepped
// at lr x the stage's scale, gradients dropped by zero, saved and loaded.
#include "support/rooms.hpp"
#include "support/scratch_dir.hpp"

namespace
{
using P1Sgd = mpx::Pipeline<mpx::Stage<tiny::Model, mpx::CPU<0>, mpx::Layers<0, 6>, mpx::Optimizer<mpx::SGD>>, mpx::Microbatches<4>,
                            mpx::Batch<tiny::Batch>>;
void fill_grads(const std::vector<at::Tensor>& ps)
{
  for (auto& p : ps) p.mutable_grad() = torch::ones_like(p);
}
}  // namespace

TEST_CASE("An SGD stage steps at lr x its scale, zero drops the gradients", "[rooms][stage_optimizers]")
{
  mpx::TrainOptions o;
  o.lr_scale = {0.5};
  mpx::StageSet<P1Sgd> set(0, torch::kCPU, rooms::make, o);
  mpx::StageOptimizers opt(set, o);
  REQUIRE(opt.has(0));
  CHECK(dynamic_cast<torch::optim::SGD*>(&opt.at(0)) != nullptr);
  const auto p = set.parameters(0).front();
  const auto before = p.detach().clone();
  fill_grads(set.parameters(0));
  opt.step(0.1);
  CHECK(torch::allclose(p.detach(), before - 0.05));  // plain SGD: p -= lr * scale * grad
  opt.zero();
  for (auto& q : set.parameters(0)) CHECK(!q.grad().defined());  // the next backward's gradient becomes it
  opt.step(0.1);  // a parameter without a gradient is left alone
  CHECK(torch::allclose(p.detach(), before - 0.05));
}

TEST_CASE("A frozen stage has no optimizer, make_optimizer replaces the policy's", "[rooms][stage_optimizers]")
{
  mpx::StageSet<rooms::P1Frozen> frozen(0, torch::kCPU, rooms::make, {});
  CHECK(!mpx::StageOptimizers(frozen, {}).has(0));
  mpx::TrainOptions o;
  int asked = -1;
  o.make_optimizer = [&](int stage, const std::vector<at::Tensor>& ps) -> std::unique_ptr<torch::optim::Optimizer> {
    asked = stage;
    return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(1.0));
  };
  mpx::StageSet<rooms::P1> set(0, torch::kCPU, rooms::make, o);
  mpx::StageOptimizers opt(set, o);
  CHECK(asked == 0);
  CHECK(dynamic_cast<torch::optim::SGD*>(&opt.at(0)) != nullptr);
  CHECK(dynamic_cast<mpx::FusedAdamW*>(&mpx::StageOptimizers(set, {}).at(0)) != nullptr);  // the default: LibTorch's AdamW, one pass
}

TEST_CASE("A built optimizer's second parameter group keeps its rate relative to the first", "[rooms][stage_optimizers]")
{
  mpx::TrainOptions o;
  o.lr_scale = {2.0};
  o.make_optimizer = [](int, const std::vector<at::Tensor>& ps) -> std::unique_ptr<torch::optim::Optimizer> {
    const std::size_t half = ps.size() / 2;
    auto opt = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>(ps.begin(), ps.begin() + half), torch::optim::SGDOptions(1.0));
    opt->add_param_group(torch::optim::OptimizerParamGroup(std::vector<at::Tensor>(ps.begin() + half, ps.end()),
                                                           std::make_unique<torch::optim::SGDOptions>(0.1)));  // a tenth of the first
    return opt;
  };
  mpx::StageSet<rooms::P1> set(0, torch::kCPU, rooms::make, o);
  mpx::StageOptimizers opt(set, o);
  fill_grads(set.parameters(0));
  opt.step(1e-2);
  const auto& groups = opt.at(0).param_groups();
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].options().get_lr() == Approx(2e-2));  // lr x the stage's scale, whatever the first group was built with
  CHECK(groups[1].options().get_lr() == Approx(2e-3));  // and a tenth of that
}

TEST_CASE("The default AdamW's step leaves each gradient's sum of squares for the norm, SGD's none", "[rooms][stage_optimizers]")
{
  mpx::StageSet<rooms::P1> set(0, torch::kCPU, rooms::make, {});
  mpx::StageOptimizers opt(set, {});
  fill_grads(set.parameters(0));
  opt.step(1e-2);
  for (auto& p : set.parameters(0)) {
    const auto sq = opt.stepped_grad_sq(p);
    REQUIRE(sq.has_value());
    CHECK(*sq == double(p.numel()));  // gradients of ones
  }
  mpx::StageSet<P1Sgd> sgd_set(0, torch::kCPU, rooms::make, {});
  mpx::StageOptimizers sgd(sgd_set, {});
  fill_grads(sgd_set.parameters(0));
  sgd.step(1e-2);
  CHECK_FALSE(sgd.stepped_grad_sq(sgd_set.parameters(0).front()).has_value());
}

TEST_CASE("AdamW state saved and loaded continues identically, a corrupt file names itself", "[rooms][stage_optimizers]")
{
  const std::string dir = test::scratch_dir("mpx-stage-optimizers");
  mpx::StageSet<rooms::P1> a(0, torch::kCPU, rooms::make, {}), b(0, torch::kCPU, rooms::make, {});
  mpx::StageOptimizers oa(a, {}), ob(b, {});
  fill_grads(a.parameters(0));
  oa.step(1e-2);
  oa.save(0, dir + "/opt.pt");
  ob.load(0, dir + "/opt.pt");
  for (std::size_t i = 0; i < a.parameters(0).size(); ++i) b.parameters(0)[i].detach().copy_(a.parameters(0)[i].detach());
  fill_grads(a.parameters(0));
  fill_grads(b.parameters(0));
  oa.step(1e-2);
  ob.step(1e-2);
  for (std::size_t i = 0; i < a.parameters(0).size(); ++i) CHECK(torch::equal(a.parameters(0)[i], b.parameters(0)[i]));
  std::ofstream(dir + "/bad.pt") << "not an archive";
  CHECK_THROWS_WITH(ob.load(0, dir + "/bad.pt"), Catch::Contains("bad.pt") && Catch::Contains("incomplete or corrupt"));
  std::filesystem::remove_all(dir);
}
