// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/model.hpp: forward shapes, masks, partial rotary, stage ranges = whole
// model, the key/value cache, and examples/moondream/config.hpp.
#include "../../../tests/support/catch_torch.hpp"
#include "../model.hpp"

namespace
{
moondream::Config small()
{
  auto c = moondream::load_config("tiny");
  c.text.vocab_size = 300, c.tokenizer.bos_id = c.tokenizer.eos_id = 299;
  return c;
}
moondream::Batch batch(const moondream::Config& c, int B, int L, std::vector<int64_t> tiling)
{
  const int S = c.vision.crop_size;
  int64_t nmax = 0;
  for (std::size_t i = 0; i < tiling.size(); i += 2) nmax = std::max(nmax, 1 + tiling[i] * tiling[i + 1]);
  auto tokens = torch::randint(0, c.text.vocab_size - 1, {B, L}, torch::kLong);
  auto targets = tokens.clone();
  targets.narrow(1, 0, L / 2).fill_(moondream::ignore_index);
  return {torch::rand({B, nmax, 3, S, S}) * 2 - 1, torch::tensor(tiling, torch::kLong).view({B, 2}), tokens, targets};
}
}  // namespace

TEST_CASE("Configs load, derive the grid and reject inconsistent fields", "[moondream][config]")
{
  for (const char* n : {"tiny", "tiny-reference", "medium", "md05", "md2"}) {
    auto c = moondream::load_config(n);
    CHECK(c.vision.proj_out_dim == c.text.dim);
  }
  auto md2 = moondream::load_config("md2");
  CHECK(md2.vision.grid() == 27);
  CHECK(md2.prefix() == 730);
  CHECK(md2.text.qkv_dim() == 6144);
  CHECK(moondream::load_config("tiny").prefix() == 65);
  CHECK_THROWS_WITH(moondream::parse_config(R"({"vision": {"proj_out_dim": 100}})", "x.json"), Catch::Contains("must equal text.dim"));
  // rot_dim omitted: half of each head rotates, as the reference asserts (rot_dim == 2 * (head_dim / 4))
  const auto wide = moondream::parse_config(R"({"vision": {"proj_out_dim": 1024}, "text": {"dim": 1024, "n_heads": 8, "n_kv_heads": 8}})", "x.json");
  CHECK(wide.text.head_dim() == 128);
  CHECK(wide.text.rot_dim == 64);
  CHECK_THROWS_WITH(moondream::parse_config("{", "x.json"), Catch::Contains("not valid JSON"));
  CHECK_THROWS_WITH(moondream::load_config("nope"), Catch::Contains("shipped names"));
}

TEST_CASE("Mask: bidirectional prefix, causal after it", "[moondream][model]")
{
  auto m = moondream::text_mask(6, 0, 3);
  CHECK(m.sizes() == torch::IntArrayRef({6, 6}));
  CHECK(m[0][2].item<bool>());   // prefix position sees a later prefix position
  CHECK(!m[2][3].item<bool>());  // but not the text after it
  CHECK(m[4][3].item<bool>());
  CHECK(!m[3][4].item<bool>());  // text is causal
  auto d = moondream::text_mask(1, 5, 3);  // one new token after 5 cached
  CHECK(d.sizes() == torch::IntArrayRef({1, 6}));
  CHECK(d.all().item<bool>());
}

TEST_CASE("Partial rotary rotates the first rot dims only and keeps dot products relative", "[moondream][model]")
{
  auto c = small();
  moondream::Rotary rope(c.text);
  auto x = torch::randn({1, 2, 5, 64});
  auto y = rope.apply(x, 7);
  CHECK(torch::equal(y.narrow(-1, 32, 32), x.narrow(-1, 32, 32)));  // non-rotary dims untouched
  CHECK(!torch::allclose(y.narrow(-1, 0, 32), x.narrow(-1, 0, 32)));
  CHECK(torch::allclose(y.norm(2, -1), x.norm(2, -1), 1e-5, 1e-5));  // rotations keep norms
  CHECK(torch::equal(rope.apply(x, 0).select(2, 0), x.select(2, 0)));  // position 0: identity
  // q·k depends only on the distance of the positions
  auto q = torch::randn({1, 1, 1, 64}), k = torch::randn({1, 1, 1, 64});
  auto dot = [&](int pq, int pk) { return (rope.apply(q, pq) * rope.apply(k, pk)).sum().item<double>(); };
  CHECK(dot(10, 3) == Approx(dot(20, 13)).epsilon(1e-4));
}

TEST_CASE("Forward shapes: vision, text ranges, whole model, ranges compose to the whole", "[moondream][model]")
{
  auto c = small();
  torch::manual_seed(0);
  moondream::Moondream whole(c);
  auto b = batch(c, 2, 7, {1, 1, 1, 1});
  auto img = whole->vision->forward(b.crops, b);
  CHECK(img.sizes() == torch::IntArrayRef({2, c.vision.tokens(), c.text.dim}));
  auto logits = whole->forward(b);  // supervised positions only: targets of the last 4 of 7 tokens
  CHECK(logits.sizes() == torch::IntArrayRef({2 * 4, c.text.vocab_size}));
  // the same weights split as [0, 1) [1, 3) [3, 4) give the same logits
  moondream::Text t0(c, 0, 1), t1(c, 1, 3), t2(c, 3, 4);
  torch::NoGradGuard ng;
  auto all = whole->text->named_weights();
  for (auto* t : {&t0, &t1, &t2})
    for (auto& [n, p] : (*t)->named_weights()) p.copy_(all.at(n));
  auto h = t0->forward(img, b);
  CHECK(h.sizes() == torch::IntArrayRef({2, c.prefix() + 7, c.text.dim}));
  auto split = t2->forward(t1->forward(h, b), b);
  CHECK(torch::allclose(split, logits, 1e-5, 1e-5));
  CHECK(t1->named_weights().count("text.blocks.2.attn.qkv.weight") == 1);
  CHECK(t1->named_weights().count("text.blocks.0.attn.qkv.weight") == 0);
  // the loss reads answer targets only, and equals cross-entropy over all positions with ignored ones
  auto loss = moondream::answer_loss(logits, b);
  auto every = t2->all_logits(t2->run_blocks(t1->forward(h, b)), b);
  auto ref = torch::nn::functional::cross_entropy(every.reshape({-1, every.size(-1)}), b.targets.reshape(-1),
                                                  torch::nn::functional::CrossEntropyFuncOptions().ignore_index(moondream::ignore_index));
  CHECK(loss.item<double>() == Approx(ref.item<double>()).epsilon(1e-5));
}

TEST_CASE("Vision: several tilings in one batch, a local crop changes only its sample", "[moondream][model]")
{
  auto c = small();
  c.vision.max_crops = 4;
  torch::manual_seed(1);
  moondream::Vision v(c);
  auto b = batch(c, 2, 3, {1, 1, 2, 2});
  torch::NoGradGuard ng;
  auto y = v->forward(b.crops, b);
  CHECK(y.sizes() == torch::IntArrayRef({2, c.vision.tokens(), c.text.dim}));
  auto b2 = b;
  b2.crops = b.crops.clone();
  b2.crops[1][4].mul_(-1);  // last local crop of sample 1
  auto y2 = v->forward(b2.crops, b2);
  CHECK(torch::equal(y2[0], y[0]));
  CHECK(!torch::allclose(y2[1], y[1]));
}

TEST_CASE("The cached decoder gives the logits of a full forward, GQA runs", "[moondream][model]")
{
  for (int kv : {2, 1}) {
    auto c = small();
    c.text.n_kv_heads = kv;
    torch::manual_seed(2);
    moondream::Moondream m(c);
    torch::NoGradGuard ng;
    auto b = batch(c, 1, 6, {1, 1});
    auto full = m->text->all_logits(m->text->run_blocks(m->text->embed(m->vision->forward(b.crops, b), b.tokens)), b);  // (1, 6, V)
    auto cache = m->encode_image(b.crops, b.tiling);
    CHECK(cache.length() == c.prefix());
    auto h = m->text->run_blocks(m->text->embed_tokens(b.tokens.narrow(1, 0, 3)), c.prefix(), &cache);
    auto step = m->text->head(h.select(1, 2));  // predicts token 3
    CHECK(torch::allclose(step, full.select(1, 3), 1e-4, 1e-4));
  }
}

TEST_CASE("VisionText ranges of pieces (vision blocks, then text layers) compose to the whole model, under global names", "[moondream][model][balance]")
{
  auto c = small();  // 4 vision blocks, 4 text layers: pieces [0, 8)
  torch::manual_seed(3);
  moondream::Moondream whole(c);
  auto b = batch(c, 2, 5, {1, 1, 1, 1});
  const auto want = whole->forward(b);
  // cut inside the encoder, and with the encoder's tail and the first text layers on one stage
  moondream::VisionText a(c, 0, 2), mid(c, 2, 5), last(c, 5, 8);
  std::map<std::string, torch::Tensor> names;
  for (auto* part : {&a, &mid, &last}) names.merge((*part)->named_weights());
  const auto reference = whole->named_weights();
  REQUIRE(names.size() == reference.size());
  {
    torch::NoGradGuard ng;
    for (auto& [n, p] : names) p.copy_(reference.at(n));  // every name is found: the throw of at() fails the test
  }
  CHECK(!a->text);           // the encoder's first half only
  CHECK(mid->text->begin == 0);
  CHECK(mid->text->end == 1);
  auto got = last->forward(mid->forward(a->forward(b.crops, b), b), b);
  CHECK(torch::allclose(got, want, 1e-5, 1e-5));
  // a frozen encoder runs under no-grad: nothing of it reaches the autograd graph
  for (auto& p : mid->vision->parameters()) p.requires_grad_(false);
  auto h = mid->forward(a->forward(b.crops, b).detach(), b);
  CHECK(h.requires_grad());  // the text layer trains
  for (auto& p : mid->text->parameters()) p.requires_grad_(false);
  CHECK(!mid->forward(a->forward(b.crops, b).detach(), b).requires_grad());
  CHECK_THROWS_WITH(moondream::VisionText(c, 3, 9), Catch::Contains("are not inside [0, 8)"));
}
