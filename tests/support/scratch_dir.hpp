// SPDX-License-Identifier: Apache-2.0
#pragma once
// A fresh, empty directory for one test: <temp>/<name>_<pid>, emptied if it exists.
#include <unistd.h>  // ::getpid

#include <filesystem>
#include <string>

namespace test
{
inline std::string scratch_dir(const std::string& name)
{
  auto d = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}
}  // namespace test
