// A synthetic click log with a known answer, generated on the fly: the workload of embedding
// tables on parameter-server shards and DLRM-style models.
//
// Example i is a pure function of (options, i) (the seed is one of the options), computed from
// counter-based hashes (zipf.h's SplitMixStream keyed by a hash of i, the field and the seed), so
// any range of examples can be filled by any worker in any order, and nothing proportional to the
// id space or the number of examples is ever stored: a ClickLog holds O(num_dense +
// num_categorical) numbers, so a table of 2^30 (or 2^62) ids costs nothing here.
//
// An example has
// - num_dense dense features, each a standard normal (float);
// - num_categorical categorical features, one id each, in [0, ids(f)), ids(f) = ids_per_feature[f]
//   (or ids_per_feature[0] for every field). Field f draws a popularity rank k in [1, ids(f)] from
//   Zipf(zipf_s) (P(k) proportional to k^-zipf_s, zipf.h's ZipfSampler, O(1) per draw for any
//   range) and writes id = IdOfRank(f, k) = P_f(k - 1), P_f a seeded bijection of [0, ids(f)) per
//   field (zipf.h's IdPermutation): the popular ids are scattered over the range, not 0, 1, 2, ...
//   (an id's rank is RankOfId(f, id));
// - a label from a planted logistic model:
//     logit = bias + sum_f planted(f, id_f) + w . dense,
//     probability = sigmoid(logit) (as a float; the label is 1 with exactly this probability),
//   where planted(f, id) = planted_scale * z(seed, f, id), z a standard normal made from a hash
//   of (seed, f, id) (PlantedEffect), and w = dense_scale * g / |g|, g a seeded standard normal
//   vector (dense_weights(): w . dense is N(0, dense_scale^2)).
// The probability is the best any model of these features can predict, so OracleMetrics' AUC and
// log loss over a range of examples are the best achievable on those examples.
//
// The defaults (13 dense, 26 categorical over 10^6 ids each, zipf_s 1.05, planted_scale 0.25,
// dense_scale 0.6, bias -1.4), measured on the 10^5 test examples [kTestBegin, kTestBegin + 10^5)
// with seed 0: positive rate 0.265, oracle AUC 0.800, oracle log loss 0.458 (predicting the
// positive rate for every example: 0.579); seeds 1 to 5 give positive rates 0.24 to 0.29 and AUCs
// 0.799 to 0.808 (the hottest ids' planted effects move the rate). Generation: about 3.9e5
// examples/s on one core (2.5 us an example, 0.1 us a categorical id; the same for 10^9 and 2^62
// ids per field; Release build, AMD EPYC); a process filling batches of 4096 stays under 5 MB of
// RSS.
//
// Train/test convention: examples [0, kTestBegin) are for training and [kTestBegin, 2^62) for
// testing; all are independent draws from one distribution, so the two never share an example.
//
// Thread safety: a ClickLog is immutable after Create; Fill and the rest are const and may run
// on several threads at once (each with its own ClickBatch).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/data/dataset.h"
#include "common/data/click/zipf.h"

namespace gradsync {

struct ClickLogOptions {
  int num_dense = 13;        // [0, kMaxClickLogFeatures]
  int num_categorical = 26;  // [1, kMaxClickLogFeatures]
  // Ids per categorical feature, each in [1, 2^62]: one value for every field, or one per field.
  std::vector<int64_t> ids_per_feature = {1000000};
  double zipf_s = 1.05;         // (0, 3]
  double planted_scale = 0.25;  // >= 0: the spread of each field's planted effect per id
  double dense_scale = 0.6;     // >= 0: the spread of the dense part of the logit
  double bias = -1.4;           // finite
  uint64_t seed = 0;

  // OK, or kInvalidArgument with one line naming the first bad option.
  Status Validate() const;
};

inline constexpr int kMaxClickLogFeatures = 1 << 16;

// Examples [begin, begin + size) of a ClickLog, row-major. Fill reuses the vectors: filling the
// same size again allocates nothing.
struct ClickBatch {
  int64_t begin = 0;
  int64_t size = 0;
  int num_dense = 0;
  int num_categorical = 0;
  std::vector<float> dense;        // size * num_dense
  std::vector<uint64_t> ids;       // size * num_categorical, fields in order
  std::vector<int32_t> labels;     // size, 0 or 1
  std::vector<float> probability;  // size: the planted model's P(label = 1)
};

// The best achievable quality on a range of examples: the planted probabilities' AUC and mean
// log loss against the labels (binary_metrics.h), and the labels' mean.
struct ClickOracleMetrics {
  double auc = 0.0;
  double log_loss = 0.0;
  double positive_rate = 0.0;
};

// Examples [begin, begin + n) of `log` as a Dataset a trainer reads (Dataset::mixed: dim dense
// features, and CSR keys: each example's ids, one per categorical feature in order; labels 0/1,
// two classes), named `name`, generated on demand (Dataset::source): it stores nothing, and a
// batch's rows are made when the batch is gathered. The log needs a dense feature (a mixed
// Dataset has both parts).
class ClickLog;
Dataset ClickLogDataset(const ClickLog& log, int64_t begin, int64_t n, const std::string& name);

class ClickLog {
 public:
  // The first test example; [0, kTestBegin) is the training range.
  static constexpr int64_t kTestBegin = int64_t{1} << 40;

  static Result<ClickLog> Create(const ClickLogOptions& options);

  // Examples [begin, begin + count) into *out (0 <= begin, 0 <= count, begin + count <= 2^62,
  // checked). Example i comes out the same whatever range it is filled in.
  void Fill(int64_t begin, int64_t count, ClickBatch* out) const;
  // Over examples [begin, begin + count), generated in pieces: O(count) memory for the sort.
  ClickOracleMetrics OracleMetrics(int64_t begin, int64_t count) const;

  const ClickLogOptions& options() const { return options_; }
  int num_dense() const { return options_.num_dense; }
  int num_categorical() const { return options_.num_categorical; }
  // The number of ids of field f.
  uint64_t ids(int field) const;

  // Examples base + positions[k] (a data set's rows: ClickLogDataset), row-major into the vectors
  // (resized): dense features, ids, labels.
  void FillRows(int64_t base, std::span<const uint32_t> positions, std::vector<float>* dense,
                std::vector<uint64_t>* ids, std::vector<int32_t>* labels) const;

  // planted(f, id): field f's contribution to the logit of an example with this id.
  double PlantedEffect(int field, uint64_t id) const;
  // w: the dense features' weights in the logit.
  std::span<const float> dense_weights() const { return dense_weights_; }
  // The id of popularity rank `rank` (1 = the most frequent) of field f, and back.
  uint64_t IdOfRank(int field, uint64_t rank) const;
  uint64_t RankOfId(int field, uint64_t id) const;

 private:
  struct Field {
    ZipfSampler zipf;
    IdPermutation ranks_to_ids;
    uint64_t planted_key;  // hashes (f, id) to planted(f, id)
    uint64_t stream_salt;  // this field's stream of an example
  };
  explicit ClickLog(const ClickLogOptions& options);
  // Example i into the given rows.
  void FillExample(int64_t i, float* dense, uint64_t* id_row, int32_t* label,
                   float* probability) const;
  double Planted(const Field& field, uint64_t id) const;

  ClickLogOptions options_;
  std::vector<Field> fields_;
  std::vector<float> dense_weights_;
  uint64_t example_key_ = 0;  // hashes i to the key of example i's streams
  uint64_t dense_salt_ = 0;
  uint64_t label_salt_ = 0;
};

}  // namespace gradsync
