// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/costs.hpp
/// Moondream's cost per micro-batch, from its config and the shape of a batch, and the layouts built on it.
/// The model is a sequence of pieces: the encoder's blocks (the first with the patch embedding, the last with
/// the stitching and the projection), then the decoder's layers (the first with the token embedding, the
/// last with the head on the supervised positions). A piece costs the FLOPs of its matrix products forward,
/// and twice that backward when it trains (a frozen encoder's never run backward). `mpx::balance` partitions the
/// pieces into one range per device; each range is one `VisionText` stage (model.hpp).
///
/// | `--layout` | devices | the partition                                                    |
/// |---|---|---|
/// | `2`        | 2       | vision \| text                                                   |
/// | `2b`       | 2       | balanced by the costs                                            |
/// | `4`        | 4       | vision \| text in three equal ranges                             |
/// | `4b`       | 4       | balanced by the costs (the encoder may span two devices)         |

#include "config.hpp"  // moondream::Config
#include "model.hpp"   // moondream::Batch, ignore_index

#include <mpx/mpx.hpp>  // mpx::LayerCost, mpx::balance, mpx::predict

#include <fmt/format.h>  // fmt::format

#include <algorithm>  // std::max, std::min
#include <optional>   // std::optional
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

namespace moondream
{

/// The shape of one micro-batch, averaged over a step's micro-batches.
struct Workload
{
  double samples = 1;  ///< samples per micro-batch
  double crops = 2;    ///< crops per sample (1 + rows x cols)
  double tokens = 16;  ///< text tokens per sample (the padded length)
  double answers = 4;  ///< supervised tokens per sample
};

/// The workload of a step's micro-batches.
inline Workload workload_of(const std::vector<Batch>& mbs)
{
  Workload w{0, 0, 0, 0};
  for (const auto& b : mbs) {
    const auto tiling = b.tiling.to(torch::kCPU).to(torch::kDouble);
    w.samples += double(b.tokens.size(0));
    w.crops += (1 + tiling.select(1, 0) * tiling.select(1, 1)).sum().item<double>();
    w.tokens += double(b.tokens.size(0) * b.tokens.size(1));
    w.answers += (b.targets != ignore_index).sum().item<double>();
  }
  w.crops /= w.samples, w.tokens /= w.samples, w.answers /= w.samples;
  w.samples /= double(mbs.size());
  return w;
}

/// How much longer per FLOP the encoder's pieces compute than the decoder's, forward and backward (1: as their
/// FLOPs say). The FLOP counts leave out what runs at memory speed — normalisations, softmax, GELU over the
/// encoder's many patches — so on a CPU an encoder block takes longer than its FLOPs give; `--costs measured`
/// times one of each (speeds.hpp) and scales the encoder's pieces by the ratio.
struct CostScale
{
  double vision_forward = 1, vision_backward = 1;
};

/// The pieces' costs per micro-batch in FLOPs (the encoder's scaled by `scale`): [vision block 0, ..., V-1, text
/// layer 0, ..., n-1].
inline std::vector<mpx::LayerCost> piece_costs(const Config& c, const Workload& w, const CostScale& scale = {})
{
  const auto& v = c.vision;
  const auto& t = c.text;
  const double P = v.tokens(), E = v.enc_dim, crops = w.samples * w.crops;
  const double patches = crops * 2 * P * v.patch_features() * E;
  const double block = crops * (2 * P * (4 * E * E + 2 * E * v.enc_ff_dim) + 4 * P * P * E);
  const double projection = w.samples * 2 * P * (2 * E * v.proj_inner_dim + double(v.proj_inner_dim) * v.proj_out_dim);
  const double T = c.prefix() + w.tokens, D = t.dim;
  const double layer = w.samples * (2 * T * (D * t.qkv_dim() + D * D + 2 * D * t.ff_dim) + 4 * T * T * D);
  const double head = w.samples * 2 * w.answers * D * t.vocab_size;
  auto cost = [](double forward, double fs = 1, double bs = 1) { return mpx::LayerCost{std::int64_t(forward * fs), std::int64_t(2 * forward * bs)}; };
  std::vector<mpx::LayerCost> pieces;
  for (int i = 0; i < v.enc_n_layers; ++i)
    pieces.push_back(cost(block + (i == 0 ? patches : 0) + (i + 1 == v.enc_n_layers ? projection : 0), scale.vision_forward, scale.vision_backward));
  for (int i = 0; i < t.n_layers; ++i) pieces.push_back(cost(layer + (i + 1 == t.n_layers ? head : 0)));
  return pieces;
}

/// Whether `layout` is a balanced one (2b, 4b), and its slots.
inline bool is_balanced(const std::string& layout) { return layout == "2b" || layout == "4b"; }
inline int slots_of(const std::string& layout) { return layout == "4" || layout == "4b" ? 4 : 2; }

/// Calls `f.template operator()<Tag>()` with the schedule tag `--schedule` names.
template <class F>
decltype(auto) with_schedule(const std::string& schedule, F&& f)
{
  if (schedule == "gpipe") return f.template operator()<mpx::GPipe>();
  if (schedule == "zbh1") return f.template operator()<mpx::ZBH1>();
  if (schedule == "1f1b") return f.template operator()<mpx::OneFOneB>();
  throw mpx::config_error("moondream_train: --schedule " + schedule + " is not known; use gpipe, 1f1b or zbh1");
}

/// Where a layout puts the pieces, and what it predicts.
struct Plan
{
  std::string layout;
  int slots = 2;
  int vision_blocks = 0;    ///< V: pieces [0, V) are the encoder's
  mpx::Partition part{};          ///< slot k holds pieces [part[k], part[k+1])
  int frozen_slots = 0;     ///< leading slots of frozen encoder blocks only: they run forward only
  mpx::StageCosts load{};   ///< each slot's cost per micro-batch
  mpx::Proof predicted{};   ///< the schedule's timeline under those costs, each slot at its speed (in the fastest's time)
  std::vector<double> speeds;  ///< each slot's relative speed (empty: all equal)
  CostScale scale;             ///< the encoder's time per FLOP against the decoder's
  Workload workload{};      ///< the micro-batch shape the costs are for
  /// Whether slot 0 holds the whole encoder and nothing else (as layouts 2 and 4 part).
  bool vision_alone() const { return part[1] == vision_blocks; }
  std::pair<int, int> pieces(int k) const { return {part[std::size_t(k)], part[std::size_t(k) + 1]}; }
  /// Whether slot k holds encoder blocks only, and whether it holds encoder blocks beside decoder layers.
  bool encoder_only(int k) const { return pieces(k).second <= vision_blocks; }
  bool mixes(int k) const { return pieces(k).first < vision_blocks && pieces(k).second > vision_blocks; }
  /// The text layers [b, e) of slot k (b == e: none).
  std::pair<int, int> text_range(int k) const
  {
    const auto [b, e] = pieces(k);
    return {std::max(b, vision_blocks) - vision_blocks, std::max(e, vision_blocks) - vision_blocks};
  }
};

/// The partition of `layout`: layouts 2 and 4 as `moondream_train` always partition them (vision alone, text in equal
/// ranges), 2b and 4b by `mpx::balance` under the schedule. With the encoder frozen, the leading slots that
/// hold only its blocks run forward only (unless `forward_only` is false: then they run a backward too). `speeds`:
/// each slot's relative speed (empty: all equal; speeds.hpp) — the balanced layouts cut for them.
inline Plan plan_of(const std::string& layout, const std::string& schedule, const Config& c, const Workload& w, int microbatches,
                    bool frozen_vision, bool forward_only = true, const std::vector<double>& speeds = {},
                    std::optional<mpx::Partition> cut = {}, const CostScale& scale = {})
{
  const auto pieces = piece_costs(c, w, scale);
  Plan p;
  p.scale = scale;
  p.layout = layout;
  p.workload = w;
  p.slots = slots_of(layout);
  p.vision_blocks = c.vision.enc_n_layers;
  p.speeds = speeds;
  if (!mpx::valid_speeds(speeds, p.slots))
    throw mpx::config_error(fmt::format("moondream_train: {} device speeds for layout {} of {} devices; give one positive speed per device",
                                        speeds.size(), layout, p.slots));
  const int n = c.text.n_layers, V = p.vision_blocks, frozen = frozen_vision ? V : 0;
  if (is_balanced(layout) ? V + n < p.slots : n < p.slots - 1)
    throw mpx::config_error(fmt::format("moondream_train: {} vision blocks and {} text layers are too few for layout {}; choose a smaller layout",
                                        V, n, layout));
  with_schedule(schedule, [&]<class Tag>() {
    if (cut) p.part = *cut;
    else if (is_balanced(layout)) p.part = mpx::balance<Tag>(pieces, p.slots, microbatches, frozen, speeds);
    else {
      p.part[1] = V;
      for (int k = 1; k < p.slots; ++k) p.part[std::size_t(k) + 1] = V + n * k / (p.slots - 1);
    }
    mpx::Layout l = mpx::partition_layout(p.part, p.slots, microbatches, frozen);
    if (!forward_only) l.forward_only = 0;
    p.frozen_slots = l.forward_only;
    p.load = mpx::stage_costs(pieces, p.part, p.slots, frozen);
    p.predicted = mpx::predict<Tag>(l, mpx::at_speeds(p.load, p.slots, speeds));
  });
  return p;
}

/// "layout 2b: slot 0: vision [0, 27) + text [0, 3)  1.95 TFLOP | slot 1: text [3, 24) ...; predicted step ..., bubble ...".
inline std::string describe(const Plan& p)
{
  const Workload& w = p.workload;
  std::int64_t most = p.predicted.makespan;
  for (int k = 0; k < p.slots; ++k) most = std::max(most, p.load.forward[std::size_t(k)] + p.load.backward[std::size_t(k)]);
  const bool giga = most < std::int64_t(1e12);  // small configs in GFLOP
  const char* unit = giga ? "GFLOP" : "TFLOP";
  auto amount = [giga](std::int64_t f) { return fmt::format("{:.2f}", double(f) / (giga ? 1e9 : 1e12)); };
  std::string s = fmt::format("layout {}:", p.layout);
  for (int k = 0; k < p.slots; ++k) {
    const auto [b, e] = p.pieces(k);
    const auto [tb, te] = p.text_range(k);
    std::string what;
    if (b < p.vision_blocks) what = fmt::format("vision [{}, {})", b, std::min(e, p.vision_blocks));
    if (te > tb) what += fmt::format("{}text [{}, {})", what.empty() ? "" : " + ", tb, te);
    s += fmt::format("{} slot {}: {}{} {} {}", k == 0 ? "" : " |", k, what, k < p.frozen_slots ? " (forward only)" : "",
                     amount(p.load.forward[std::size_t(k)] + p.load.backward[std::size_t(k)]), unit);
  }
  std::string at;
  if (p.scale.vision_forward != 1 || p.scale.vision_backward != 1)
    at += fmt::format("; encoder at {:.2f}x (forward) and {:.2f}x (backward) the decoder's time per FLOP", p.scale.vision_forward, p.scale.vision_backward);
  for (std::size_t k = 0; k < p.speeds.size(); ++k) at += fmt::format("{}{:.3g}", k == 0 ? "; devices' speeds " : ", ", p.speeds[k]);
  s += fmt::format("{}; predicted step {} {}-time{}, bubble {:.1f}% (micro-batches of {:.0f} samples, {:.1f} crops and {:.0f} tokens each)", at,
                   amount(p.predicted.makespan), unit, p.speeds.empty() ? "" : " of the fastest", 100 * p.predicted.bubble(), w.samples, w.crops, w.tokens);
  return s;
}

}  // namespace moondream
