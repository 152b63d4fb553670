// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file io/safetensors.hpp
/// Safetensors files, read and written to the letter of the format: 8 bytes little-endian header length N,
/// N bytes of JSON `{"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
/// "__metadata__": {"key": "value"}}`, then the data; offsets are relative to the data section.
///
/// - `load_safetensors(path)` maps the file (copy-on-write) and returns tensors that view it without a
///   copy (misaligned tensors are copied); every length, offset, shape and dtype is checked before use, and
///   any violation is a `mpx::config_error` naming the file, the tensor and the rule.
/// - `save_safetensors(path, tensors, metadata)` writes entries sorted by dtype size then name (so every
///   tensor is aligned), pads the header with spaces to a multiple of 8, and writes atomically: a temporary
///   file in the same directory, flushed, then renamed over `path` — a crash leaves the old file intact.

#include <mpx/errors.hpp>  // mpx::config_error
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <nlohmann/json_fwd.hpp>  // nlohmann::json (declared; defined below, for the definitions)
#include <torch/torch.h>      // at::Tensor, torch::from_blob

#include <fcntl.h>     // open
#include <sys/mman.h>  // mmap
#include <sys/stat.h>  // fstat
#include <unistd.h>    // close, fsync

#include <cstdint>    // std::uint64_t
#include <cstdio>     // std::rename
#include <cstring>    // std::memcpy
#include <fstream>    // std::ofstream
#include <map>        // std::map
#include <memory>     // std::shared_ptr
#include <string>     // std::string
#include <vector>     // std::vector

namespace mpx
{

/// The contents of a safetensors file.
struct Safetensors
{
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

namespace detail
{
struct dtype_name
{
  const char* name;
  at::ScalarType type;
};
inline constexpr dtype_name safetensors_dtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
    {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool}};

MPX_DECL at::ScalarType dtype_from(const std::string& file, const std::string& tensor, const std::string& name);
MPX_DECL const char* dtype_to(at::ScalarType t);

/// A read-only view of a file, kept alive by the tensors that point into it.
struct Mapping
{
  void* base = MAP_FAILED;
  std::size_t size = 0;
  ~Mapping();
};
}  // namespace detail

/// Reads a safetensors file (see the file comment).
MPX_DECL Safetensors load_safetensors(const std::string& path);

/// Writes a safetensors file atomically (see the file comment).
MPX_DECL void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <nlohmann/json.hpp>  // nlohmann::json

namespace mpx::detail
{

MPX_DECL at::ScalarType dtype_from(const std::string& file, const std::string& tensor, const std::string& name)
{
  for (auto& d : safetensors_dtypes)
    if (name == d.name) return d.type;
  throw config_error("mpx: " + file + ": tensor '" + tensor + "' has dtype \"" + name +
                     "\", which LibTorch 1.13 cannot hold (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL); convert the file");
}

MPX_DECL const char* dtype_to(at::ScalarType t)
{
  for (auto& d : safetensors_dtypes)
    if (t == d.type) return d.name;
  throw config_error(std::string("mpx: safetensors cannot store dtype ") + c10::toString(t) + "; convert the tensor first");
}

MPX_DECL Mapping::~Mapping()
{
  if (base != MAP_FAILED) ::munmap(base, size);
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL Safetensors load_safetensors(const std::string& path)
{
  auto fail = [&](const std::string& what) {
    throw config_error("mpx: " + path + " is not a valid safetensors file: " + what);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);  // a FIFO opens without waiting for a writer
  if (fd < 0) throw config_error("mpx: cannot open " + path + ": " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw config_error("mpx: " + path + " is not a regular file (a FIFO, device or directory); pass a safetensors file");
  }
  auto map = std::make_shared<detail::Mapping>();
  map->size = std::size_t(st.st_size);
  if (map->size < 8) {
    ::close(fd);
    fail("it has " + std::to_string(map->size) + " bytes, fewer than the 8-byte header length");
  }
  // copy-on-write: in-place ops on loaded tensors never touch the file
  map->base = ::mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map->base == MAP_FAILED) throw config_error("mpx: cannot map " + path + ": " + std::strerror(errno));
  const auto* bytes = static_cast<const unsigned char*>(map->base);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian
  if (n > map->size - 8)
    fail("the header claims " + std::to_string(n) + " bytes but only " + std::to_string(map->size - 8) + " follow");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(bytes + 8, bytes + 8 + n);
  } catch (const std::exception& e) {
    fail(std::string("the header is not JSON (") + e.what() + ")");
  }
  if (!h.is_object()) fail("the header is not a JSON object");
  const std::size_t data_size = map->size - 8 - std::size_t(n);
  unsigned char* data = static_cast<unsigned char*>(map->base) + 8 + n;
  Safetensors out;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (auto& [name, e] : h.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) fail("__metadata__ is not an object of strings");
      for (auto& [k, v] : e.items()) {
        if (!v.is_string()) fail("__metadata__[\"" + k + "\"] is not a string");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      fail(where + " lacks dtype, shape or data_offsets");
    if (!e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
      fail(where + " has a malformed dtype, shape or data_offsets");
    const auto type = detail::dtype_from(path, name, e["dtype"].get<std::string>());
    std::vector<std::int64_t> shape;
    std::uint64_t count = 1;
    for (auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) fail(where + " has a negative or non-integer extent");
      const auto x = d.get<std::uint64_t>();
      if (x != 0 && count > (std::uint64_t(1) << 62) / x) fail(where + " has a shape too large to address");
      count *= x;
      shape.push_back(std::int64_t(x));
    }
    for (auto& o : e["data_offsets"])
      if (!o.is_number_unsigned()) fail(where + " has a negative or non-integer data offset");
    const auto b = e["data_offsets"][0].get<std::uint64_t>(), en = e["data_offsets"][1].get<std::uint64_t>();
    if (count > ~std::uint64_t(0) / c10::elementSize(type))  // before multiplying: count * size would wrap
      fail(where + " has a shape too large to address (" + std::to_string(count) + " elements of " +
           std::to_string(c10::elementSize(type)) + " bytes)");
    const std::uint64_t need = count * c10::elementSize(type);
    if (b > en || en > data_size)
      fail(where + " spans bytes [" + std::to_string(b) + ", " + std::to_string(en) + ") of a " + std::to_string(data_size) +
           "-byte data section");
    if (en - b != need)
      fail(where + " holds " + std::to_string(en - b) + " bytes but its dtype and shape need " + std::to_string(need));
    ranges.emplace_back(b, en);
    at::Tensor t = torch::from_blob(data + b, shape, [map](void*) {}, torch::TensorOptions().dtype(type));
    if ((8 + n + b) % c10::elementSize(type) != 0) t = t.clone();  // misaligned: copy
    out.tensors[name] = t;
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) fail("two tensors overlap in the data section");
  return out;
}

MPX_DECL void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                             const std::map<std::string, std::string>& metadata)
{
  std::vector<std::pair<std::string, at::Tensor>> order;
  for (auto& [k, t] : tensors) {
    if (k == "__metadata__") throw config_error("mpx: a tensor cannot be called __metadata__ in a safetensors file");
    order.emplace_back(k, t.detach().cpu().contiguous());
  }
  std::stable_sort(order.begin(), order.end(), [](auto& a, auto& b) {
    return a.second.element_size() > b.second.element_size();  // names stay sorted within a size
  });
  nlohmann::json h = nlohmann::json::object();
  std::uint64_t off = 0;
  for (auto& [k, t] : order) {
    const std::uint64_t bytes = std::uint64_t(t.numel()) * t.element_size();
    h[k] = {{"dtype", detail::dtype_to(t.scalar_type())}, {"shape", t.sizes().vec()}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw config_error("mpx: cannot write " + tmp + ": " + std::strerror(errno));
    unsigned char len[8];
    std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(header.data(), std::streamsize(header.size()));
    for (auto& [k, t] : order) f.write(static_cast<const char*>(t.data_ptr()), std::streamsize(t.numel() * t.element_size()));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      throw config_error("mpx: writing " + tmp + " failed (disk full?); " + path + " is unchanged");
    }
  }
  if (int fd = ::open(tmp.c_str(), O_RDONLY); fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw config_error("mpx: cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
