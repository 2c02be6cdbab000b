#include "common/data/click/click_log.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>
#include <string>

#include "common/base/check.h"
#include "common/base/numeric/rng.h"
#include "common/data/binary_metrics.h"

namespace gradsync {
namespace {

// Derive ids under kClickLogStream.
enum : uint64_t {
  kExamplesKey = 1,
  kDenseSalt = 2,
  kLabelSalt = 3,
  kDenseWeights = 4,
  kFieldRanks = 5,
  kFieldPlanted = 6,
  kFieldSalt = 7,
};

std::string Describe(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

Status Refuse(const std::string& what) { return InvalidArgumentError("click log: " + what); }

// A standard normal from two 64-bit words (Box-Muller's cosine half).
double NormalFrom(uint64_t w1, uint64_t w2) {
  double u1 = (static_cast<double>(w1 >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
  double u2 = static_cast<double>(w2 >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace

Status ClickLogOptions::Validate() const {
  if (num_dense < 0 || num_dense > kMaxClickLogFeatures) {
    return Refuse("num_dense = " + std::to_string(num_dense) + ": must be in [0, " +
                  std::to_string(kMaxClickLogFeatures) + "]");
  }
  if (num_categorical < 1 || num_categorical > kMaxClickLogFeatures) {
    return Refuse("num_categorical = " + std::to_string(num_categorical) + ": must be in [1, " +
                  std::to_string(kMaxClickLogFeatures) + "]");
  }
  if (ids_per_feature.size() != 1 &&
      ids_per_feature.size() != static_cast<size_t>(num_categorical)) {
    return Refuse("ids_per_feature has " + std::to_string(ids_per_feature.size()) +
                  " values: give one for every field or one per field (num_categorical = " +
                  std::to_string(num_categorical) + ")");
  }
  for (size_t f = 0; f < ids_per_feature.size(); ++f) {
    int64_t n = ids_per_feature[f];
    if (n < 1 || static_cast<uint64_t>(n) > kMaxZipfRange) {
      return Refuse("ids_per_feature[" + std::to_string(f) + "] = " + std::to_string(n) +
                    ": must be in [1, 2^62]");
    }
  }
  if (!(zipf_s > 0.0 && zipf_s <= 3.0)) {
    return Refuse("zipf_s = " + Describe(zipf_s) + ": must be in (0, 3]");
  }
  if (!(planted_scale >= 0.0 && std::isfinite(planted_scale))) {
    return Refuse("planted_scale = " + Describe(planted_scale) + ": must be finite and >= 0");
  }
  if (!(dense_scale >= 0.0 && std::isfinite(dense_scale))) {
    return Refuse("dense_scale = " + Describe(dense_scale) + ": must be finite and >= 0");
  }
  if (!std::isfinite(bias)) return Refuse("bias = " + Describe(bias) + ": must be finite");
  return OkStatus();
}

Result<ClickLog> ClickLog::Create(const ClickLogOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  return ClickLog(options);
}

ClickLog::ClickLog(const ClickLogOptions& options) : options_(options) {
  const uint64_t seed = options.seed;
  example_key_ = Rng::Derive(seed, kClickLogStream, kExamplesKey);
  dense_salt_ = Rng::Derive(seed, kClickLogStream, kDenseSalt);
  label_salt_ = Rng::Derive(seed, kClickLogStream, kLabelSalt);
  fields_.reserve(static_cast<size_t>(options.num_categorical));
  for (int f = 0; f < options.num_categorical; ++f) {
    const auto n =
        static_cast<uint64_t>(options.ids_per_feature.size() == 1 ? options.ids_per_feature[0]
                                                                  : options.ids_per_feature[f]);
    const auto field = static_cast<uint64_t>(f);
    fields_.push_back(
        Field{ZipfSampler(n, options.zipf_s),
              IdPermutation(n, Rng::Derive(seed, kClickLogStream, kFieldRanks, field)),
              Rng::Derive(seed, kClickLogStream, kFieldPlanted, field),
              Rng::Derive(seed, kClickLogStream, kFieldSalt, field)});
  }
  Rng rng(Rng::Derive(seed, kClickLogStream, kDenseWeights));
  std::vector<double> g(static_cast<size_t>(options.num_dense));
  double norm2 = 0.0;
  for (double& v : g) {
    v = rng.Normal();
    norm2 += v * v;
  }
  dense_weights_.resize(g.size());
  for (size_t j = 0; j < g.size(); ++j) {
    dense_weights_[j] = static_cast<float>(options.dense_scale * g[j] / std::sqrt(norm2));
  }
}

uint64_t ClickLog::ids(int field) const {
  GRADSYNC_CHECK(field >= 0 && field < num_categorical()) << "field " << field;
  return fields_[static_cast<size_t>(field)].zipf.n();
}

double ClickLog::PlantedEffect(int field, uint64_t id) const {
  GRADSYNC_CHECK(id < ids(field)) << "id " << id;
  return Planted(fields_[static_cast<size_t>(field)], id);
}

double ClickLog::Planted(const Field& field, uint64_t id) const {
  uint64_t h1 = Rng::SplitMix64(field.planted_key ^ id);
  return options_.planted_scale * NormalFrom(h1, Rng::SplitMix64(h1));
}

uint64_t ClickLog::IdOfRank(int field, uint64_t rank) const {
  GRADSYNC_CHECK(rank >= 1 && rank <= ids(field)) << "rank " << rank;
  return fields_[static_cast<size_t>(field)].ranks_to_ids.Forward(rank - 1);
}

uint64_t ClickLog::RankOfId(int field, uint64_t id) const {
  GRADSYNC_CHECK(id < ids(field)) << "id " << id;
  return fields_[static_cast<size_t>(field)].ranks_to_ids.Inverse(id) + 1;
}

void ClickLog::FillExample(int64_t i, float* dense, uint64_t* id_row, int32_t* label,
                           float* probability) const {
  const uint64_t key = Rng::SplitMix64(example_key_ ^ static_cast<uint64_t>(i));
  double logit = options_.bias;
  SplitMixStream dense_stream(key ^ dense_salt_);
  for (int j = 0; j < num_dense(); j += 2) {
    // Box-Muller: a pair of independent standard normals from a pair of words.
    double u1 = (static_cast<double>(dense_stream.Next() >> 11) + 0.5) * 0x1.0p-53;
    double theta =
        2.0 * std::numbers::pi * static_cast<double>(dense_stream.Next() >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    dense[j] = static_cast<float>(r * std::cos(theta));
    if (j + 1 < num_dense()) dense[j + 1] = static_cast<float>(r * std::sin(theta));
  }
  for (int j = 0; j < num_dense(); ++j) logit += static_cast<double>(dense_weights_[j]) * dense[j];
  for (int f = 0; f < num_categorical(); ++f) {
    const Field& field = fields_[static_cast<size_t>(f)];
    SplitMixStream stream(key ^ field.stream_salt);
    uint64_t id = field.ranks_to_ids.Forward(field.zipf.Sample(&stream) - 1);
    id_row[f] = id;
    logit += Planted(field, id);
  }
  float p = static_cast<float>(1.0 / (1.0 + std::exp(-logit)));
  *probability = p;
  SplitMixStream label_stream(key ^ label_salt_);
  *label = label_stream.Uniform() < static_cast<double>(p) ? 1 : 0;
}

void ClickLog::Fill(int64_t begin, int64_t count, ClickBatch* out) const {
  GRADSYNC_CHECK(begin >= 0 && count >= 0 && begin <= static_cast<int64_t>(kMaxZipfRange) - count)
      << "examples [" << begin << ", " << begin << " + " << count << ")";
  const auto rows = static_cast<size_t>(count);
  const auto dense = static_cast<size_t>(num_dense()),
             categorical = static_cast<size_t>(num_categorical());
  out->begin = begin;
  out->size = count;
  out->num_dense = num_dense();
  out->num_categorical = num_categorical();
  out->dense.resize(rows * dense);
  out->ids.resize(rows * categorical);
  out->labels.resize(rows);
  out->probability.resize(rows);
  for (size_t r = 0; r < rows; ++r) {
    FillExample(begin + static_cast<int64_t>(r), out->dense.data() + r * dense,
                out->ids.data() + r * categorical, &out->labels[r], &out->probability[r]);
  }
}

namespace {

// A ClickLog's examples [begin, begin + n) as a data set's rows.
class ClickLogRows final : public RowSource {
 public:
  ClickLogRows(ClickLog log, int64_t begin) : log_(std::move(log)), begin_(begin) {}
  void Fill(std::span<const uint32_t> indices, std::vector<float>* x, std::vector<int64_t>* row_ptr,
            std::vector<uint64_t>* keys, std::vector<int32_t>* labels) const override {
    log_.FillRows(begin_, indices, x, keys, labels);
    const auto fields = static_cast<int64_t>(log_.num_categorical());
    row_ptr->resize(indices.size() + 1);
    for (size_t i = 0; i <= indices.size(); ++i) (*row_ptr)[i] = static_cast<int64_t>(i) * fields;
  }

 private:
  ClickLog log_;
  int64_t begin_;
};

}  // namespace

Dataset ClickLogDataset(const ClickLog& log, int64_t begin, int64_t n, const std::string& name) {
  Dataset d;
  d.name = name;
  d.n = n;
  d.dim = log.num_dense();
  d.num_classes = 2;
  d.sparse = true;
  d.source = std::make_shared<ClickLogRows>(log, begin);
  return d;
}

void ClickLog::FillRows(int64_t base, std::span<const uint32_t> positions, std::vector<float>* dense,
                        std::vector<uint64_t>* ids, std::vector<int32_t>* labels) const {
  const size_t n = positions.size(), d = static_cast<size_t>(num_dense()), f = static_cast<size_t>(num_categorical());
  dense->resize(n * d);
  ids->resize(n * f);
  labels->resize(n);
  float probability = 0;
  for (size_t i = 0; i < n; ++i) {
    FillExample(base + positions[i], dense->data() + i * d, ids->data() + i * f, labels->data() + i, &probability);
  }
}

ClickOracleMetrics ClickLog::OracleMetrics(int64_t begin, int64_t count) const {
  GRADSYNC_CHECK(count > 0) << "no examples";
  std::vector<float> probability;
  std::vector<int32_t> labels;
  probability.reserve(static_cast<size_t>(count));
  labels.reserve(static_cast<size_t>(count));
  ClickBatch batch;
  constexpr int64_t kPiece = 4096;
  for (int64_t at = begin; at < begin + count; at += kPiece) {
    Fill(at, std::min(kPiece, begin + count - at), &batch);
    probability.insert(probability.end(), batch.probability.begin(), batch.probability.end());
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
  }
  ClickOracleMetrics m;
  m.auc = Auc(probability, labels);
  m.log_loss = MeanLogLoss(probability, labels);
  int64_t positives = 0;
  for (int32_t y : labels) positives += y;
  m.positive_rate = static_cast<double>(positives) / static_cast<double>(count);
  return m;
}

}  // namespace gradsync
