#include "common/data/binary_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/base/check.h"

namespace gradsync {

double Auc(std::span<const float> scores, std::span<const int32_t> labels) {
  GRADSYNC_CHECK(scores.size() == labels.size())
      << scores.size() << " scores, " << labels.size() << " labels";
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  struct Scored {
    float score;
    int32_t label;
  };
  std::vector<Scored> sorted(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    GRADSYNC_CHECK(labels[i] == 0 || labels[i] == 1) << "label " << labels[i] << " at " << i;
    if (std::isnan(scores[i])) return kNaN;
    sorted[i] = {scores[i], labels[i]};
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const Scored& a, const Scored& b) { return a.score < b.score; });
  // Walk groups of equal scores from the lowest: each positive beats every negative below its
  // group and ties with the group's negatives.
  double wins = 0.0;
  int64_t negatives_below = 0, positives = 0;
  for (size_t begin = 0; begin < sorted.size();) {
    size_t end = begin;
    int64_t group_positives = 0, group_negatives = 0;
    for (; end < sorted.size() && sorted[end].score == sorted[begin].score; ++end) {
      (sorted[end].label == 1 ? group_positives : group_negatives) += 1;
    }
    wins += static_cast<double>(group_positives) *
            (static_cast<double>(negatives_below) + 0.5 * static_cast<double>(group_negatives));
    negatives_below += group_negatives;
    positives += group_positives;
    begin = end;
  }
  if (positives == 0 || negatives_below == 0) return kNaN;
  return wins / (static_cast<double>(positives) * static_cast<double>(negatives_below));
}

double MeanLogLoss(std::span<const float> probabilities, std::span<const int32_t> labels) {
  GRADSYNC_CHECK(probabilities.size() == labels.size())
      << probabilities.size() << " probabilities, " << labels.size() << " labels";
  if (probabilities.empty()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0.0;
  for (size_t i = 0; i < probabilities.size(); ++i) {
    GRADSYNC_CHECK(labels[i] == 0 || labels[i] == 1) << "label " << labels[i] << " at " << i;
    double p =
        std::clamp(static_cast<double>(probabilities[i]), kLogLossEpsilon, 1.0 - kLogLossEpsilon);
    sum -= labels[i] == 1 ? std::log(p) : std::log1p(-p);
  }
  return sum / static_cast<double>(probabilities.size());
}

}  // namespace gradsync
