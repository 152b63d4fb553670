// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/data.hpp
/// Data for the moondream example (the generated default, `ShapesVqa`, is shapes.hpp):
/// - `Sample`, `Dataset`: a picture with its question and answer, and a set of them;
/// - `load_image`, `save_png`: pictures from and to files;
/// - `JsonlVqa`: real data, JSONL lines of {"image", "question", "answer"} or DOCCI-style {"image",
///   "description"} (asked as "Describe this image."), image paths relative to the file; a malformed line
///   or a missing image is an error naming file and line;
/// - `collate`: samples → one `moondream::Batch` (crops, tiling, prompt + answer tokens, answer targets).
/// Images are decoded with stb_image (PNG, JPEG, BMP, GIF, ...).

#include "config.hpp"     // moondream::Config
#include "files.hpp"      // moondream::check_regular_file, read_line, max_*_bytes
#include "image.hpp"      // moondream::overlap_crops, normalize
#include "model.hpp"      // moondream::Batch
#include "tokenizer.hpp"  // moondream::Tokenizer

#include <mpx/errors.hpp>  // mpx::config_error

#include <nlohmann/json.hpp>  // nlohmann::json
#include <stb/stb_image.h>    // stbi_load_from_memory
#include <stb/stb_image_write.h>  // stbi_write_png
#include <torch/torch.h>

#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream
#include <string>      // std::string
#include <vector>      // std::vector

namespace moondream
{

struct Sample
{
  at::Tensor image;  ///< (H, W, 3) uint8
  std::string question, answer;
  std::string kind;  ///< question family (generated set) or "" — for per-kind accuracy
};

class Dataset
{
 public:
  virtual ~Dataset() = default;
  virtual std::size_t size() const = 0;
  virtual Sample get(std::size_t i) const = 0;
  /// Sample i's answer alone (a file-backed set answers without decoding the image).
  virtual std::string answer(std::size_t i) const { return get(i).answer; }
};

/// Decodes an image file to (H, W, 3) uint8. Only a regular file of at most max_image_bytes is read, and
/// never more than its checked size; a picture of more than max_image_pixels is refused before decoding; a
/// file that does not decode (not an image, truncated, damaged) is an error saying so.
inline at::Tensor load_image(const std::string& path)
{
  const auto size = std::size_t(check_regular_file(path, max_image_bytes, "image"));
  std::ifstream f(path, std::ios::binary);
  std::vector<unsigned char> bytes(size + 1);
  f.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size()));
  const auto n = std::size_t(f.gcount());
  if (n > size) throw mpx::config_error("moondream: image " + path + " changed while read; is something writing it?");
  int w = 0, h = 0, c = 0;
  const auto undecodable = [&] {
    return mpx::config_error("moondream: cannot decode image " + path + " (stb_image: " + (stbi_failure_reason() ? stbi_failure_reason() : "unknown") +
                             "): it is not a PNG, JPEG, BMP or GIF, or it is truncated or damaged; open it in an image viewer and save it again as PNG or JPEG");
  };
  if (!stbi_info_from_memory(bytes.data(), int(n), &w, &h, &c)) throw undecodable();
  if (std::int64_t(w) * h > max_image_pixels)
    throw mpx::config_error("moondream: image " + path + " is " + std::to_string(w) + " x " + std::to_string(h) + " pixels, more than " +
                            std::to_string(max_image_pixels / 1'000'000) + " megapixels; scale it down first (the model sees it as a few crops of a few hundred pixels)");
  unsigned char* px = stbi_load_from_memory(bytes.data(), int(n), &w, &h, &c, 3);
  if (!px) throw undecodable();
  auto t = torch::from_blob(px, {h, w, 3}, torch::kByte).clone();
  stbi_image_free(px);
  return t;
}

inline void save_png(const std::string& path, const at::Tensor& img_HWC)
{
  auto c = img_HWC.contiguous();
  if (!stbi_write_png(path.c_str(), int(c.size(1)), int(c.size(0)), 3, c.data_ptr<uint8_t>(), int(c.size(1)) * 3))
    throw mpx::config_error("moondream: cannot write " + path);
}

/// JSONL of {"image", "question", "answer"} or {"image", "description"}; images relative to the file.
class JsonlVqa : public Dataset
{
 public:
  explicit JsonlVqa(const std::string& path)
  {
    check_regular_file(path, max_data_bytes, "data file");
    std::ifstream in(path);
    if (!in) throw mpx::config_error("moondream: cannot read data file " + path + "; pass a JSONL file (--data)");
    const auto dir = std::filesystem::path(path).parent_path();
    std::string line;
    for (int no = 1; read_line(in, line, path + ":" + std::to_string(no)); ++no) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = path + ":" + std::to_string(no);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        throw mpx::config_error("moondream: " + where + ": not a JSON object (" + e.what() + "); fix or remove the line");
      }
      auto str = [&](const char* k) -> std::string {
        if (!j.is_object() || !j.contains(k) || !j[k].is_string())
          throw mpx::config_error("moondream: " + where + ": missing string field \"" + k +
                                  "\"; a line is {\"image\", \"question\", \"answer\"} or {\"image\", \"description\"}");
        return j[k].get<std::string>();
      };
      Item it;
      const std::string image = str("image");
      if (image.empty() || image.find('\0') != std::string::npos)
        throw mpx::config_error("moondream: " + where + ": the image path is empty or holds a NUL character; fix the line");
      auto img = std::filesystem::path(image);
      it.image = (img.is_absolute() ? img : dir / img).string();
      if (j.is_object() && j.contains("description")) {
        it.question = "Describe this image.";
        it.answer = str("description");
      } else {
        it.question = str("question");
        it.answer = str("answer");
      }
      std::error_code ec;
      const auto st = std::filesystem::status(it.image, ec);  // the error_code form: a path too long or unreadable is no exception
      if (ec || !std::filesystem::exists(st))
        throw mpx::config_error("moondream: " + where + ": image " + it.image + " does not exist; fix the path (relative to the JSONL file)");
      if (!std::filesystem::is_regular_file(st))
        throw mpx::config_error("moondream: " + where + ": image " + it.image + " is not a regular file (a FIFO, device or directory); pass a file");
      it.where = where;
      items_.push_back(std::move(it));
    }
    if (items_.empty()) throw mpx::config_error("moondream: " + path + " holds no samples");
  }
  std::size_t size() const override { return items_.size(); }
  std::string answer(std::size_t i) const override { return items_.at(i).answer; }
  Sample get(std::size_t i) const override
  {
    const auto& it = items_.at(i);
    try {
      return {load_image(it.image), it.question, it.answer, ""};
    } catch (const mpx::config_error& e) {
      throw mpx::config_error(it.where + ": " + e.what());
    }
  }

 private:
  struct Item { std::string image, question, answer, where; };
  std::vector<Item> items_;
};

/// The era-A prompt of a question: "\n\nQuestion: <q>\n\nAnswer:" (as finetune_text.py tokenises it).
inline std::vector<int> prompt_ids(const Tokenizer& tok, const std::string& question)
{
  return tok.encode("\n\nQuestion: " + question + "\n\nAnswer:");
}

/// Samples → one batch: crops padded to the largest count, tokens right-padded with EOS; the targets are
/// the answer tokens (" " + answer, then EOS), -100 elsewhere.
inline Batch collate(const std::vector<Sample>& samples, const Tokenizer& tok, const Config& c)
{
  const auto B = int64_t(samples.size());
  std::vector<at::Tensor> crops;
  std::vector<int64_t> tiling;
  std::vector<std::vector<int64_t>> toks, tgts;
  int64_t nmax = 0, lmax = 0;
  for (auto& s : samples) {
    auto cr = overlap_crops(s.image, c.vision);
    crops.push_back(normalize(cr.pixels));
    tiling.push_back(cr.rows), tiling.push_back(cr.cols);
    nmax = std::max(nmax, cr.pixels.size(0));
    auto p = prompt_ids(tok, s.question);
    auto a = tok.encode(" " + s.answer);
    a.push_back(c.tokenizer.eos_id);
    std::vector<int64_t> t(p.begin(), p.end()), g(p.size(), ignore_index);
    t.insert(t.end(), a.begin(), a.end());
    g.insert(g.end(), a.begin(), a.end());
    if (int64_t(t.size()) + c.prefix() > c.text.max_context)
      throw mpx::config_error("moondream: a sample has " + std::to_string(t.size()) + " tokens; with the image prefix that exceeds text.max_context (" +
                              std::to_string(c.text.max_context) + "); shorten the answer or raise max_context");
    lmax = std::max(lmax, int64_t(t.size()));
    toks.push_back(std::move(t)), tgts.push_back(std::move(g));
  }
  const int S = c.vision.crop_size;
  auto crops_t = torch::zeros({B, nmax, c.vision.in_channels, S, S});
  auto tokens = torch::full({B, lmax}, int64_t(c.tokenizer.eos_id), torch::kLong);
  auto targets = torch::full({B, lmax}, ignore_index, torch::kLong);
  for (int64_t i = 0; i < B; ++i) {
    crops_t[i].narrow(0, 0, crops[i].size(0)).copy_(crops[i]);
    tokens[i].narrow(0, 0, int64_t(toks[i].size())).copy_(torch::tensor(toks[i], torch::kLong));
    targets[i].narrow(0, 0, int64_t(tgts[i].size())).copy_(torch::tensor(tgts[i], torch::kLong));
  }
  return {crops_t, torch::tensor(tiling, torch::kLong).view({B, 2}), tokens, targets};
}

}  // namespace moondream
