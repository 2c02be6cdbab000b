// The quality of a binary classifier's scores over a set of examples: exact ROC AUC and mean log
// loss. Here in data/ (which includes only base/) so that the click log's oracle
// (data/click_log.h), the worker's evaluation and the experiments all use the same code.
#pragma once

#include <cstdint>
#include <span>

namespace gradsync {

// The area under the ROC curve of `scores` against `labels` (0 or 1, checked; the same length,
// checked): the probability that a random positive scores above a random negative, a tie counting
// one half (the Mann-Whitney statistic). Exact, by sorting: O(n log n) time, O(n) memory. NaN when
// there is no positive or no negative, or a score is NaN. Scores are compared only by order, so
// probabilities and logits give the same AUC.
double Auc(std::span<const float> scores, std::span<const int32_t> labels);

// The mean of -log(p) over positives and -log(1 - p) over negatives (natural log), p a predicted
// probability of label 1, clamped to [kLogLossEpsilon, 1 - kLogLossEpsilon] so that a confident
// mistake costs about 16.1 rather than infinity. NaN for no examples or a NaN probability.
inline constexpr double kLogLossEpsilon = 1e-7;
double MeanLogLoss(std::span<const float> probabilities, std::span<const int32_t> labels);

}  // namespace gradsync
