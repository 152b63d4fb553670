// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/files.hpp
/// Reading the example's input files safely: only regular files (a FIFO, device or directory could block
/// or never end), each of bounded size, lines of bounded length. Every refusal is a config_error naming the
/// file and the fix.

#include <mpx/errors.hpp>  // mpx::config_error

#include <cstdint>     // std::uintmax_t
#include <filesystem>  // std::filesystem
#include <istream>     // std::istream
#include <string>      // std::string

namespace moondream
{

/// Bounds on what a run reads: an image file, a data file, a tokenizer file, one line of a data file.
inline constexpr std::uintmax_t max_image_bytes = std::uintmax_t(64) << 20;
/// An image's pixels (a small file can declare a huge picture): 100 megapixels, 300 MB decoded.
inline constexpr std::int64_t max_image_pixels = 100'000'000;
inline constexpr std::uintmax_t max_data_bytes = std::uintmax_t(16) << 30;
inline constexpr std::uintmax_t max_tokenizer_bytes = std::uintmax_t(256) << 20;
inline constexpr std::size_t max_line_bytes = std::size_t(1) << 20;

/// Whether `path` names an existing regular file (never throws, never opens it).
inline bool is_regular(const std::string& path)
{
  std::error_code ec;
  return std::filesystem::is_regular_file(std::filesystem::status(path, ec)) && !ec;
}

/// Checks that `path` is a regular file of at most `limit` bytes, and returns its size; `what` names it in
/// the error.
inline std::uintmax_t check_regular_file(const std::string& path, std::uintmax_t limit, const std::string& what)
{
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw mpx::config_error("moondream: " + what + " " + path + " does not exist; fix the path");
  if (!fs::is_regular_file(st)) throw mpx::config_error("moondream: " + what + " " + path + " is not a regular file (a FIFO, device or directory); pass a file");
  const auto size = fs::file_size(path, ec);
  if (ec || size > limit)
    throw mpx::config_error("moondream: " + what + " " + path + " is larger than " + std::to_string(limit >> 20) + " MiB; is it the right file?");
  return size;
}

/// Reads one line of at most max_line_bytes into `line` (without its '\n'); false at the end of the input.
/// `where` names the file in the error for a longer line.
inline bool read_line(std::istream& in, std::string& line, const std::string& where)
{
  line.clear();
  if (in.peek() == std::istream::traits_type::eof()) return false;
  for (int c; (c = in.get()) != std::istream::traits_type::eof() && c != '\n';) {
    if (line.size() == max_line_bytes)
      throw mpx::config_error("moondream: " + where + ": a line is longer than " + std::to_string(max_line_bytes >> 20) +
                              " MiB; is it the right file?");
    line.push_back(char(c));
  }
  return true;
}

}  // namespace moondream
