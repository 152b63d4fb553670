// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file user_table.hpp
/// `mpx::UserTable<"...">`: a schedule written by hand, checked by the same proof as the built-ins.
///
/// Grammar: one line per rank (lines separated by '\n' or ';', empty lines skipped), tokens separated
/// by spaces. A token is `[stage:]OPmb`:
/// - `F3`, `B3`, `I3`, `W3`: forward, full backward, input-gradient, weight-gradient of micro-batch 3;
/// - `RF3`, `RB3`: post the receive that `F3` (resp. `B3`/`I3`) will consume;
/// - `stage:` names the stage when the rank holds several (`4:F0`); otherwise the rank's only stage.
/// Sends need no token: a result leaves right after the compute that makes it. A line without any `R`
/// token gets its receives posted one receiving compute ahead, as the built-ins do; a line with `R`
/// tokens posts exactly where they stand, and they must follow the order of the computes.
///
/// Example (2 ranks, 2 micro-batches, 1F1B with receives posted ahead):
/// ```
/// using T = mpx::UserTable<"F0 F1 B0 B1 ; F0 B0 F1 B1">;
/// ```

#include <mpx/action.hpp>    // mpx::Table, mpx::Layout
#include <mpx/config.hpp>    // mpx::fixed_string

#include <string_view>  // std::string_view

namespace mpx
{

namespace detail
{
/// One parsed token.
struct user_token
{
  bool recv = false;
  Op op = Op::F;
  int stage = -1;  // -1: the rank's only stage
  int mb = 0;
};

constexpr bool is_digit(char c) { return c >= '0' && c <= '9'; }

/// Parses one token; false if it is not in the grammar.
constexpr bool parse_token(std::string_view t, user_token& out)
{
  std::size_t i = 0;
  auto number = [&](int& v) {
    if (i >= t.size() || !is_digit(t[i])) return false;
    v = 0;
    while (i < t.size() && is_digit(t[i])) v = v * 10 + (t[i++] - '0');
    return true;
  };
  out = {};
  if (auto colon = t.find(':'); colon != std::string_view::npos) {
    int s = 0;
    if (!number(s) || i != colon) return false;
    out.stage = s;
    i = colon + 1;
  }
  if (i < t.size() && t[i] == 'R') { out.recv = true; ++i; }
  if (i >= t.size()) return false;
  switch (t[i++]) {
    case 'F': out.op = Op::F; break;
    case 'B': out.op = Op::B; break;
    case 'I': if (out.recv) return false; out.op = Op::I; break;
    case 'W': if (out.recv) return false; out.op = Op::W; break;
    default: return false;
  }
  if (!number(out.mb)) return false;
  return i == t.size();
}

/// Calls `f(rank, token_text)` for every token, in order; returns the number of ranks.
template <class F>
constexpr int for_each_token(std::string_view text, F&& f)
{
  int rank = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t e = i;
    while (e < text.size() && text[e] != '\n' && text[e] != ';') ++e;
    std::string_view line = text.substr(i, e - i);
    bool any = false;
    std::size_t j = 0;
    while (j < line.size()) {
      while (j < line.size() && (line[j] == ' ' || line[j] == '\t' || line[j] == '\r' || line[j] == ',')) ++j;
      std::size_t k = j;
      while (k < line.size() && !(line[k] == ' ' || line[k] == '\t' || line[k] == '\r' || line[k] == ',')) ++k;
      if (k > j) {
        f(rank, line.substr(j, k - j));
        any = true;
      }
      j = k;
    }
    if (any) ++rank;
    i = e + 1;
  }
  return rank;
}

/// True if every token of the text is in the grammar.
constexpr bool user_table_parses(std::string_view text)
{
  bool ok = true;
  int n = for_each_token(text, [&](int, std::string_view tok) {
    user_token t;
    if (!parse_token(tok, t)) ok = false;
  });
  return ok && n > 0;
}

/// Builds the table of a text for a layout. Shape errors (a rank count or stage that does not fit the
/// layout, an `R` token out of order) are left in `malformed_*` for the proof to report.
constexpr Table user_table(std::string_view text, const Layout& l)
{
  const int ranks = for_each_token(text, [](int, std::string_view) {});
  Layout shape = l;
  Table t(shape, 0);
  // count computes per rank
  buffer<std::uint32_t> count(std::size_t(ranks > l.ranks ? ranks : l.ranks) + 1);
  buffer<bool> explicit_posts(std::size_t(ranks > l.ranks ? ranks : l.ranks) + 1);
  for_each_token(text, [&](int r, std::string_view tok) {
    user_token u;
    parse_token(tok, u);
    if (u.recv) explicit_posts.p[r] = true;
    else ++count.p[r];
  });
  std::uint32_t total = 0;
  for (int r = 0; r < ranks; ++r) total += count.p[r];
  t = Table(shape, total);
  if (ranks != l.ranks) {
    t.malformed_rank = ranks;
    t.malformed_step = -1;
    // keep begin consistent for the proof's shape check
    return t;
  }
  std::uint32_t at = 0;
  for (int r = 0; r < ranks; ++r) { t.begin.p[r] = at; at += count.p[r]; }
  t.begin.p[ranks] = at;
  buffer<int> only{std::size_t(ranks)};  // the single stage of a rank, or -1
  for (int r = 0; r < ranks; ++r) only.p[r] = -2;
  for (int s = 0; s < l.stages; ++s) {
    int& o = only.p[l.rank_of[s]];
    o = o == -2 ? s : -1;
  }
  buffer<std::uint32_t> cursor{std::size_t(ranks)}, posts{std::size_t(ranks)};
  // pass 1: computes
  for_each_token(text, [&](int r, std::string_view tok) {
    user_token u;
    parse_token(tok, u);
    if (u.recv) return;
    int s = u.stage >= 0 ? u.stage : only.p[r];
    if (s < 0 && t.malformed_rank < 0) { t.malformed_rank = r; t.malformed_step = int(cursor.p[r]); }
    t.steps.p[t.begin.p[r] + cursor.p[r]++] = Step{u.op, std::uint16_t(s < 0 ? 0 : s), std::uint32_t(u.mb), 0};
  });
  // pass 2: receive posts, for the ranks that write them; the k-th R token must name the k-th receiving compute
  for (int r = 0; r < ranks; ++r) cursor.p[r] = 0;
  for_each_token(text, [&](int r, std::string_view tok) {
    if (!explicit_posts.p[r]) return;
    user_token u;
    parse_token(tok, u);
    const std::uint32_t b = t.begin.p[r], n = t.begin.p[r + 1] - b;
    Step* c = t.steps.p + b;
    if (!u.recv) {
      c[cursor.p[r]].post_end = posts.p[r];
      ++cursor.p[r];
      return;
    }
    // find the next receiving compute after those already posted
    std::uint32_t j = posts.p[r];
    while (j < n && !l.receives(c[j].op, c[j].stage)) ++j;
    const int s = u.stage >= 0 ? u.stage : only.p[r];
    const bool same = j < n && int(c[j].stage) == s && int(c[j].mb) == u.mb &&
                      (u.op == Op::F ? c[j].op == Op::F : (c[j].op == Op::B || c[j].op == Op::I));
    if (!same && t.malformed_rank < 0) { t.malformed_rank = r; t.malformed_step = int(cursor.p[r]); }
    posts.p[r] = j < n ? j + 1 : n;
    if (cursor.p[r] == 0) t.post_begin.p[r] = posts.p[r];
    else c[cursor.p[r] - 1].post_end = posts.p[r];
  });
  // ranks without R tokens: one receiving compute ahead
  for (int r = 0; r < ranks; ++r) {
    if (explicit_posts.p[r]) continue;
    Step* c = t.steps.p + t.begin.p[r];
    const std::uint32_t n = t.begin.p[r + 1] - t.begin.p[r];
    std::uint32_t n1 = n;
    for (std::uint32_t k = n; k-- > 0;) {
      c[k].post_end = n1 < n ? n1 + 1 : n;
      if (c[k].stage < l.stages && l.receives(c[k].op, c[k].stage)) n1 = k;
    }
    t.post_begin.p[r] = n1 < n ? n1 + 1 : n;
  }
  return t;
}
}  // namespace detail

/// A hand-written schedule (see the file comment for the grammar).
template <fixed_string Text>
struct UserTable
{
  static_assert(detail::user_table_parses(Text.view()),
                "mpx::UserTable<\"...\">: the table text does not parse. Write one line per rank (separated by "
                "';' or newlines) of tokens [stage:]OPmb with OP one of F B I W RF RB, e.g. \"F0 F1 B0 B1; F0 B0 F1 B1\"");
  static constexpr std::string_view name = "UserTable";
  static constexpr std::string_view text = Text.view();
  static constexpr bool interleaved = false;
  static constexpr bool any_placement = true;
  static constexpr bool split_backward = false;  // decided per stage by the table itself: see steps()
  static constexpr Table table(const Layout& l) { return detail::user_table(Text.view(), l); }
  /// The number of steps (computes) the text holds, whatever mix of full and split backwards it uses.
  static constexpr std::size_t steps(const Layout&)
  {
    std::size_t n = 0;
    detail::for_each_token(Text.view(), [&](int, std::string_view tok) {
      detail::user_token u;
      if (detail::parse_token(tok, u) && !u.recv) ++n;
    });
    return n;
  }
};

}  // namespace mpx
