#include "worker/allreduce/tables/row_gather.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace gradsync {
namespace {

constexpr size_t kCountBytes = sizeof(uint64_t);

size_t RowBytes(const TableSpec& spec) {
  return sizeof(uint64_t) + static_cast<size_t>(spec.dim) * sizeof(float);
}

// What must agree between replicas, per table, as bytes.
std::vector<std::byte> TableFacts(const std::vector<TableSpec>& specs) {
  std::vector<std::byte> out;
  auto put = [&out](const auto& v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + sizeof(v));
  };
  for (const TableSpec& s : specs) {
    put(static_cast<int64_t>(s.dim));
    put(s.num_ids);
    put(static_cast<int32_t>(s.init.kind));
    put(s.init.scale);
    put(s.init_seed);
    put(s.max_rows_per_shard);
    put(static_cast<int32_t>(s.optimizer.kind));
    put(s.optimizer.eps);
    put(s.optimizer.initial_accumulator);
    put(s.optimizer.beta1);
    put(s.optimizer.beta2);
  }
  return out;
}

}  // namespace

Status RowGather::CheckSameTables(Collective& collective) {
  const std::vector<std::byte> mine = TableFacts(specs_);
  RETURN_IF_ERROR(collective.AllGather(mine, &parts_).WithContext("comparing the embedding tables"));
  for (size_t r = 0; r < parts_.size(); ++r) {
    if (parts_[r] == mine) continue;
    const size_t per_table = specs_.empty() ? 0 : mine.size() / specs_.size();
    size_t t = 0;
    while (per_table > 0 && t + 1 < specs_.size() && parts_[r].size() >= (t + 1) * per_table &&
           std::equal(mine.begin() + t * per_table, mine.begin() + (t + 1) * per_table, parts_[r].begin() + t * per_table)) {
      ++t;
    }
    const std::string table = specs_.empty() ? "its tables" : "table '" + specs_[t].name + "'";
    return FailedPreconditionError("rank " + std::to_string(r) + "'s " + table + " differs from rank " +
                                   std::to_string(collective.rank()) +
                                   "'s (dim, ids, initial values and their seed, bound or row optimizer): every worker "
                                   "must build the model with the same settings and seed");
  }
  return OkStatus();
}

Status RowGather::Encode(std::span<const std::vector<uint64_t>> ids, std::span<const float> grads,
                         std::vector<std::byte>* out) const {
  if (!ids.empty() && ids.size() != specs_.size()) {
    return InvalidArgumentError("a step names ids of " + std::to_string(ids.size()) +
                                " tables, the model has " + std::to_string(specs_.size()));
  }
  size_t bytes = 0, floats = 0;
  for (size_t t = 0; t < specs_.size(); ++t) {
    const size_t n = ids.empty() ? 0 : ids[t].size();
    bytes += kCountBytes + n * RowBytes(specs_[t]);
    floats += n * static_cast<size_t>(specs_[t].dim);
  }
  if (grads.size() < floats)
    return InvalidArgumentError("the rows' gradients are shorter than the step's rows");
  out->resize(bytes);
  std::byte* at = out->data();
  const float* g = grads.data();
  for (size_t t = 0; t < specs_.size(); ++t) {
    const uint64_t n = ids.empty() ? 0 : ids[t].size();
    const size_t values = static_cast<size_t>(n) * static_cast<size_t>(specs_[t].dim);
    std::memcpy(at, &n, kCountBytes);
    at += kCountBytes;
    if (n == 0) continue;
    std::memcpy(at, ids[t].data(), n * sizeof(uint64_t));
    at += n * sizeof(uint64_t);
    std::memcpy(at, g, values * sizeof(float));
    at += values * sizeof(float);
    g += values;
  }
  return OkStatus();
}

Status RowGather::Decode(int rank, std::span<const std::byte> part) {
  // Built only for an error: a step decodes every worker's message.
  auto where = [&](size_t t) {
    return "table rows all-gathered from rank " + std::to_string(rank) + ": table '" + specs_[t].name + "': ";
  };
  ids_.resize(specs_.size());
  grads_.clear();
  size_t at = 0;
  for (size_t t = 0; t < specs_.size(); ++t) {
    if (part.size() - at < kCountBytes) {
      return DataLossError(where(t) + "the message ends after " + std::to_string(part.size()) +
                           " bytes, before the table's row count");
    }
    uint64_t n = 0;
    std::memcpy(&n, part.data() + at, kCountBytes);
    at += kCountBytes;
    const size_t row = RowBytes(specs_[t]);
    if (n > (part.size() - at) / row) {
      return DataLossError(where(t) + std::to_string(n) + " rows of dim " +
                           std::to_string(specs_[t].dim) + " do not fit the " +
                           std::to_string(part.size() - at) + " bytes left of the message's " +
                           std::to_string(part.size()));
    }
    const size_t values = static_cast<size_t>(n) * static_cast<size_t>(specs_[t].dim);
    ids_[t].resize(static_cast<size_t>(n));
    if (n == 0) continue;
    std::memcpy(ids_[t].data(), part.data() + at, static_cast<size_t>(n) * sizeof(uint64_t));
    at += static_cast<size_t>(n) * sizeof(uint64_t);
    const size_t old = grads_.size();
    grads_.resize(old + values);
    std::memcpy(grads_.data() + old, part.data() + at, values * sizeof(float));
    at += values * sizeof(float);
  }
  if (at != part.size()) {
    return DataLossError("table rows all-gathered from rank " + std::to_string(rank) + ": " +
                         std::to_string(part.size() - at) +
                         " bytes past the last table's rows (a message of " +
                         std::to_string(part.size()) + " bytes, " + std::to_string(at) +
                         " expected)");
  }
  return OkStatus();
}

Status RowGather::Merge(std::span<const std::vector<std::byte>> parts) {
  replica_.DropRound();
  round_workers_ = 0;
  for (size_t r = 0; r < parts.size(); ++r) {  // rank order: the same sums on every replica
    const int rank = static_cast<int>(r);
    if (Status st = Decode(rank, parts[r]); !st.ok()) {
      replica_.DropRound();
      return st;
    }
    if (Status st = replica_.Accumulate(ids_, grads_); !st.ok()) {
      if (st.code() != StatusCode::kInvalidArgument) return st;  // past a bound: every replica alike
      return DataLossError("table rows all-gathered from rank " + std::to_string(rank) + ": " +
                           st.message());
    }
  }
  round_workers_ = static_cast<int>(parts.size());
  return OkStatus();
}

Status RowGather::Gather(std::span<const std::vector<uint64_t>> ids, std::span<const float> grads,
                         Collective& collective) {
  RETURN_IF_ERROR(Encode(ids, grads, &mine_));
  RETURN_IF_ERROR(collective.AllGather(mine_, &parts_).WithContext("all-gathering the table rows"));
  if (parts_.size() != static_cast<size_t>(collective.size())) {
    return DataLossError("the table rows' all-gather gave " + std::to_string(parts_.size()) +
                         " messages for " + std::to_string(collective.size()) + " workers");
  }
  return Merge(parts_);
}

void RowGather::Apply(float lr) {
  replica_.ApplyAccumulated(round_workers_, lr);
  round_workers_ = 0;
}

void RowGather::Drop() {
  replica_.DropRound();
  round_workers_ = 0;
}

}  // namespace gradsync
