// SPDX-License-Identifier: Apache-2.0
// moondream_query: answers a question about an image with greedy decoding. The image prefix (BOS + image
// tokens) is run through the decoder once and its key/value cache reused for every question.
//
//   moondream_query --weights runs/demo/model --image photo.png --question "What color is the shape?"
//   moondream_query --config md2 --weights model.safetensors --tokenizer tokenizer.json --image cat.jpg -q "What is this?"
//   moondream_query --weights runs/demo/model --generated 1      (the questions that fit held-out picture 1)
//   moondream_query --weights base.safetensors --adapters runs/lora/model/adapters --image photo.png -q "..."
//   moondream_query --weights runs/qat/model/quantized --generated 1     (the int4 export of a --qat run, kept packed)
#include "data.hpp"
#include "lora.hpp"  // moondream::load_adapters
#include "quantize.hpp"  // moondream::load_weights
#include "model.hpp"
#include "shapes.hpp"
#include "tokenizer.hpp"
#include "weights.hpp"

#include <CLI/CLI.hpp>

#include <iostream>

namespace
{
/// The questions a generated picture answers: a counting picture (1–3 shapes anywhere) only how many; a
/// picture of one shape on one side also its colour, kind and side (shapes.hpp, ShapesVqa).
std::vector<std::string> fitting_questions(const moondream::Sample& s)
{
  using G = moondream::ShapesVqa;
  if (s.kind == "count") return {G::count_question};
  std::vector<std::string> q(std::begin(G::one_shape_questions), std::end(G::one_shape_questions));
  q.push_back(G::count_question);
  return q;
}
}  // namespace

int main(int argc, char** argv)
{
  std::string config = "tiny", weights, adapters, tokenizer = MOONDREAM_TOKENIZER_DIR, image;
  std::vector<std::string> questions;
  int max_tokens = 64, generated = -1;
  CLI::App app{"moondream_query: answer questions about an image"};
  app.add_option("--config", config, "tiny | tiny-reference | medium | md05 | md2 | path.json")->capture_default_str();
  app.add_option("--weights", weights, "safetensors file or directory of shards (e.g. <save>/model of moondream_train, or <save>/model/quantized of a --qat run)")->required();
  app.add_option("--adapters", adapters, "LoRA adapters on top of --weights (the base): <save>/model/adapters of a moondream_train --lora run");
  app.add_option("--tokenizer", tokenizer)->capture_default_str();
  auto* img = app.add_option("--image", image, "PNG/JPEG/... file");
  app.add_option("--generated", generated, "instead of --image: held-out picture N of the generated set (seed 1, as moondream_train)");
  app.add_option("-q,--question", questions,
                 "one or more questions (each reuses the image's cache); with --generated and none, the questions that fit that picture");
  app.add_option("--max-tokens", max_tokens)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const auto c = moondream::load_config(config);
    const auto tok = moondream::Tokenizer::load(tokenizer);
    tok.check_fits(c.text.vocab_size);
    moondream::Moondream m(c);
    std::cerr << moondream::load_weights(weights, c, *m) << "\n";  // plain, or a quantized export (model/quantized of a --qat run)
    if (!adapters.empty()) moondream::load_adapters(*m, adapters);
    m->eval();
    at::Tensor pixels;
    if (generated >= 0) {
      moondream::ShapesVqa held(std::size_t(generated) + 1, 1 + 1000003, c.vision.crop_size);
      auto s = held.get(std::size_t(generated));
      pixels = s.image;
      std::cout << "image: generated held-out #" << generated << " (reference answer to \"" << s.question << "\": " << s.answer << ")\n";
      if (questions.empty()) questions = fitting_questions(s);
    } else if (*img) {
      pixels = moondream::load_image(image);
    } else {
      throw mpx::config_error("moondream_query: pass --image FILE or --generated N");
    }
    if (questions.empty()) throw mpx::config_error("moondream_query: ask something: -q \"What color is the shape?\"");
    auto crops = moondream::overlap_crops(pixels, c.vision);
    auto cache = m->encode_image(moondream::normalize(crops.pixels).unsqueeze(0), torch::tensor({int64_t(crops.rows), int64_t(crops.cols)}).view({1, 2}));
    for (auto& q : questions) {
      auto p = moondream::prompt_ids(tok, q);
      auto out = m->generate(cache, std::vector<int64_t>(p.begin(), p.end()), max_tokens);
      std::cout << "Q: " << q << "\nA:" << tok.decode(std::vector<int>(out.begin(), out.end())) << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
