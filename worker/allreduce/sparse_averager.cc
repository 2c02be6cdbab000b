#include "worker/allreduce/sparse_averager.h"

#include <cstring>
#include <map>

namespace gradsync {

Status SparseAverager::Average(const Model& model, Collective& collective) {
  const auto& layout = model.layout();
  merged_.resize(layout.size());
  const float inv_n = 1.0f / static_cast<float>(collective.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    if (!layout[t].sparse) continue;
    const SparseGrad& g = model.sparse_grad(t);
    std::vector<std::byte> mine(g.keys.size() * (sizeof(uint64_t) + sizeof(float)));
    std::memcpy(mine.data(), g.keys.data(), g.keys.size() * sizeof(uint64_t));
    std::memcpy(mine.data() + g.keys.size() * sizeof(uint64_t), g.values.data(), g.values.size() * sizeof(float));
    RETURN_IF_ERROR(collective.AllGather(mine, &gathered_));
    std::map<uint64_t, float> sum;
    for (const auto& part : gathered_) {  // rank order: the same sum on every rank
      const size_t k = part.size() / (sizeof(uint64_t) + sizeof(float));
      for (size_t q = 0; q < k; ++q) {
        uint64_t key;
        float v;
        std::memcpy(&key, part.data() + q * sizeof(uint64_t), sizeof(key));
        std::memcpy(&v, part.data() + k * sizeof(uint64_t) + q * sizeof(float), sizeof(v));
        if (key >= static_cast<uint64_t>(layout[t].size)) return DataLossError("all-gathered key out of range");
        sum[key] += v;
      }
    }
    merged_[t].keys.clear();
    merged_[t].values.clear();
    for (const auto& [k, v] : sum) {
      merged_[t].keys.push_back(k);
      merged_[t].values.push_back(v * inv_n);
    }
  }
  return OkStatus();
}

}  // namespace gradsync
