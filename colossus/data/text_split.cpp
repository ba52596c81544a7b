#include "colossus/data/text_split.h"

#include <algorithm>

namespace colossus::data {

std::optional<SplitBehavior> split_behavior_from_name(std::string_view name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return std::nullopt;
}

void find_literal_matches(std::string_view text, std::string_view literal, std::vector<TextMatch>& out) {
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  std::size_t gap = 0;
  for (std::size_t at = text.find(literal); at != std::string_view::npos; at = text.find(literal, gap)) {
    if (gap < at) out.push_back({gap, at, false});
    out.push_back({at, at + literal.size(), true});
    gap = at + literal.size();
  }
  if (gap < text.size()) out.push_back({gap, text.size(), false});
}

void split_by_matches(std::string_view text, const std::vector<TextMatch>& matches, SplitBehavior behavior,
                      bool invert, std::vector<std::string_view>& pieces) {
  // (begin, end, removed) of each piece, as tokenizers' NormalizedString::split folds them.
  struct Piece {
    std::size_t begin, end;
    bool removed;
  };
  thread_local std::vector<Piece> out;
  out.clear();
  bool previous_match = false;
  auto add = [&](const TextMatch& m, bool is_match) {
    switch (behavior) {
      case SplitBehavior::kIsolated: out.push_back({m.begin, m.end, false}); break;
      case SplitBehavior::kRemoved: out.push_back({m.begin, m.end, is_match}); break;
      case SplitBehavior::kContiguous:
        if (is_match == previous_match && !out.empty()) {
          out.back().end = m.end;
        } else {
          out.push_back({m.begin, m.end, false});
        }
        break;
      case SplitBehavior::kMergedWithPrevious:
        if (is_match && !previous_match && !out.empty()) {
          out.back().end = m.end;
        } else {
          out.push_back({m.begin, m.end, false});
        }
        break;
      case SplitBehavior::kMergedWithNext:  // walked right to left
        if (is_match && !previous_match && !out.empty()) {
          out.back().begin = m.begin;
        } else {
          out.push_back({m.begin, m.end, false});
        }
        break;
    }
    previous_match = is_match;
  };
  if (behavior == SplitBehavior::kMergedWithNext) {
    for (auto it = matches.rbegin(); it != matches.rend(); ++it) add(*it, it->is_match != invert);
    std::reverse(out.begin(), out.end());
  } else {
    for (const TextMatch& m : matches) add(m, m.is_match != invert);
  }
  for (const Piece& piece : out) {
    if (!piece.removed && piece.end > piece.begin) pieces.push_back(text.substr(piece.begin, piece.end - piece.begin));
  }
}

}  // namespace colossus::data
