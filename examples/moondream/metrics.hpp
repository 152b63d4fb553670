// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/metrics.hpp
/// What a run reports as it trains: one JSON line of metrics per step, the progress line, and a small SVG
/// of the loss curve.

#include <fmt/format.h>  // fmt::format

#include <algorithm>   // std::min, std::max
#include <chrono>      // std::chrono::steady_clock
#include <filesystem>  // std::filesystem
#include <cstdlib>     // std::strtol
#include <fstream>     // std::ofstream
#include <iostream>    // std::cout
#include <string>      // std::string
#include <vector>      // std::vector

namespace moondream
{

/// One line of metrics and the progress line.
struct Progress
{
  std::ofstream metrics;
  std::vector<double> losses;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  long first_step = 0;

  void open(const std::string& path, bool append)
  {
    if (path.empty()) return;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path().empty() ? "." : std::filesystem::path(path).parent_path());
    if (append) keep_steps_before(path, first_step);  // a resumed run rewrites the steps after its checkpoint
    metrics.open(path, append ? std::ios::app : std::ios::trunc);
  }
  /// Drops the lines of steps >= `step` from the metrics file at `path` (what a crash left after the
  /// checkpoint the run resumes from).
  static void keep_steps_before(const std::string& path, long step)
  {
    std::ifstream in(path);
    std::string line, kept;
    const std::string key = "{\"step\": ";
    while (std::getline(in, line)) {  // a line that is not a step's (a torn write) is dropped
      const char* first = line.c_str() + std::min(line.size(), key.size());
      char* end = nullptr;
      const long s = line.rfind(key, 0) == 0 ? std::strtol(first, &end, 10) : -1;
      if (end != first && s >= 0 && s < step) kept += line + "\n";
    }
    in.close();
    std::ofstream(path, std::ios::trunc) << kept;
  }
  void record(long step, long total, double loss, double lr, double grad_norm, double seconds, long samples, long tokens, bool skipped, bool print)
  {
    losses.push_back(loss);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double per_step = elapsed / double(step + 1 - first_step);
    if (metrics.is_open())
      metrics << fmt::format(R"({{"step": {}, "loss": {:.8g}, "lr": {:.6g}, "grad_norm": {:.6g}, "seconds": {:.4f}, "samples_per_s": {:.3f}, "tokens_per_s": {:.2f}, "skipped": {}}})",
                             step, loss, lr, grad_norm, seconds, samples / seconds, tokens / seconds, skipped ? "true" : "false")
              << "\n" << std::flush;
    if (print) {
      const long eta = long(per_step * double(total - step - 1));
      std::cout << fmt::format("step {:>5}/{}  loss {:.4f}  lr {:.2e}  {:.1f} samples/s  {:.0f} tokens/s  ETA {}m{:02}s{}\n", step + 1, total, loss, lr,
                               samples / seconds, tokens / seconds, eta / 60, eta % 60, skipped ? "  (skipped: inf/NaN)" : "")
                << std::flush;
    }
  }
};

/// `s` as SVG text: the XML specials escaped.
inline std::string svg_escape(const std::string& s)
{
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      default: out += ch;
    }
  }
  return out;
}

/// A small SVG of the loss per step: labelled axes (optimizer step; training loss, the answer tokens'
/// cross-entropy, mean over the step's micro-batches) and `notes` (the held-out accuracy before and after
/// training) under it.
inline void write_plot(const std::string& path, const std::vector<double>& losses, long first_step, const std::vector<std::string>& notes = {})
{
  if (path.empty() || losses.empty()) return;
  const double W = 640, H = 360, pad = 48;
  double lo = losses[0], hi = losses[0];
  for (double l : losses) lo = std::min(lo, l), hi = std::max(hi, l);
  if (hi - lo < 1e-9) hi = lo + 1;
  std::string pts;
  for (std::size_t i = 0; i < losses.size(); ++i) {
    const double x = pad + (W - 2 * pad) * double(i) / double(std::max<std::size_t>(1, losses.size() - 1));
    const double y = H - pad - (H - 2 * pad) * (losses[i] - lo) / (hi - lo);
    pts += fmt::format("{:.1f},{:.1f} ", x, y);
  }
  std::ofstream f(path);
  f << fmt::format(R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" font-family="sans-serif" font-size="12">
<rect width="{0}" height="{1}" fill="white"/>
<line x1="{2}" y1="{3}" x2="{4}" y2="{3}" stroke="black"/><line x1="{2}" y1="{2}" x2="{2}" y2="{3}" stroke="black"/>
<text x="{2}" y="{5}">loss {6:.3f}</text><text x="{2}" y="{7}">{8:.3f}</text>
<text x="{4}" y="{9}" text-anchor="end">step {10}</text><text x="{2}" y="{9}">step {11}</text>
<polyline fill="none" stroke="steelblue" stroke-width="1.5" points="{12}"/>
<text x="{13}" y="{14}" text-anchor="middle">optimizer step</text>
<text x="14" y="{15}" text-anchor="middle" transform="rotate(-90 14 {15})">training loss (answer tokens, cross-entropy)</text>
)svg",
                   W, H + 16 * double(notes.size()), pad, H - pad, W - pad, pad - 8, hi, H - pad + 14, lo, H - pad + 28, first_step + long(losses.size()), first_step + 1, pts,
                   W / 2, H - 6, H / 2);
  for (std::size_t i = 0; i < notes.size(); ++i)  // under the axes; the per-kind details stay in the log
    f << fmt::format(R"(<text x="{}" y="{}">{}</text>)", pad, H + 8 + 16 * double(i), svg_escape(notes[i].substr(0, notes[i].find("; ")))) << "\n";
  f << "</svg>\n";
}

}  // namespace moondream
