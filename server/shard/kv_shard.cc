#include "server/shard/kv_shard.h"

#include <algorithm>

#include "common/base/check.h"

namespace gradsync {
namespace {
// Adam, LARS and LAMB step a length that does not follow the gradient's scale (Adam, LAMB: m /
// sqrt(v); LARS: the trust ratio divides by ||g||), so a push's g / N would not shorten the step:
// they take g as it is at rate lr / N, weight decay undivided.
bool ScaleFree(const OptimizerOptions& o) { return o.kind != OptimizerKind::kSgd; }

// SGD applies each push as g / N, its weight decay divided by N alike; the others g as it is.
OptimizerOptions PerPushOptions(OptimizerOptions o, int num_workers, bool aggregate) {
  if (!aggregate && !ScaleFree(o)) o.weight_decay /= static_cast<float>(num_workers);
  return o;
}
}  // namespace

KvShard::KvShard(Segment range, std::vector<TensorInfo> layout, const OptimizerOptions& optimizer,
                 const LrSchedule& lr, int num_workers, bool aggregate)
    : range_(range),
      layout_(std::move(layout)),
      params_(std::make_shared<std::vector<float>>(static_cast<size_t>(range.size()), 0.0f)),
      optimizer_(PerPushOptions(optimizer, num_workers, aggregate), range.size()),
      lr_(lr),
      num_workers_(num_workers),
      push_grad_scale_(ScaleFree(optimizer) ? 1.0f : 1.0f / static_cast<float>(num_workers)),
      push_lr_scale_(ScaleFree(optimizer) ? 1.0f / static_cast<float>(num_workers) : 1.0f),
      layer_wise_(IsLayerWise(optimizer.kind)) {
  optimizer_.SetLayers(OptimizerLayers(layout_, range_));
  for (const auto& r : DenseRuns(layout_, range_)) dense_runs_.push_back({r.begin - range_.begin, r.end - range_.begin});
  for (const auto& t : layout_) {
    if (!t.sparse) continue;
    int64_t b = std::max(range_.begin, t.offset), e = std::min(range_.end, t.offset + t.size);
    if (b < e) sparse_runs_.push_back({b - range_.begin, e - range_.begin});
  }
  std::sort(sparse_runs_.begin(), sparse_runs_.end(), [](const Segment& x, const Segment& y) { return x.begin < y.begin; });
  const auto& layers = optimizer_.layers();
  for (const TensorInfo& t : layout_) {
    const auto [b, e] = Overlap(t, range_);
    if (b >= e) {
      tensor_local_.push_back({0, 0});
      tensor_layer_.push_back(-1);
      continue;
    }
    tensor_local_.push_back({b - range_.begin, e - range_.begin});
    auto it = std::lower_bound(layers.begin(), layers.end(), b - range_.begin,
                               [](const OptimizerLayer& l, int64_t at) { return l.begin < at; });
    tensor_layer_.push_back(it != layers.end() && it->begin == b - range_.begin ? static_cast<int>(it - layers.begin()) : -1);
  }
  if (aggregate) {
    accum_.assign(params_->size(), 0.0f);
    if (!sparse_runs_.empty()) touched_.assign(params_->size(), 0);
    present_.assign(layers.size(), 0);
  }
}

Status KvShard::ValidateAbsent(std::span<const Segment> segments, std::span<const uint32_t> absent) const {
  for (size_t i = 0; i < absent.size(); ++i) {
    const uint32_t t = absent[i];
    if (t >= layout_.size()) {
      return InvalidArgumentError("absent tensor " + std::to_string(t) + " of a layout of " + std::to_string(layout_.size()));
    }
    if (i > 0 && t <= absent[i - 1]) return InvalidArgumentError("absent tensors are not increasing");
    if (layout_[t].sparse) return InvalidArgumentError("absent tensor " + std::to_string(t) + " is sparse (its keys say what it has)");
    const Segment& local = tensor_local_[t];
    const bool reached = std::any_of(segments.begin(), segments.end(), [&](const Segment& s) {
      return local.begin < local.end && s.begin - range_.begin < local.end && local.begin < s.end - range_.begin;
    });
    if (!reached) {
      return InvalidArgumentError("absent tensor " + std::to_string(t) + " ('" + layout_[t].name +
                                  "') is not in the push's segments");
    }
  }
  return OkStatus();
}

template <typename Fn, typename Skip>
void KvShard::ForPresent(const Segment& s, std::span<const uint32_t> absent, Fn&& fn, Skip&& skip) const {
  const int64_t lb = s.begin - range_.begin, le = s.end - range_.begin;
  if (absent.empty()) {
    if (lb < le) fn(lb, le, int64_t{0});
    return;
  }
  std::vector<std::pair<Segment, int>> cut;  // the absent tensors' local ranges inside s, and their layers
  for (uint32_t t : absent) {
    const Segment& local = tensor_local_[t];
    const int64_t b = std::max(lb, local.begin), e = std::min(le, local.end);
    if (b < e) cut.push_back({{b, e}, tensor_layer_[t]});
  }
  std::sort(cut.begin(), cut.end(), [](const auto& x, const auto& y) { return x.first.begin < y.first.begin; });
  int64_t at = lb;
  for (const auto& [range, layer] : cut) {
    if (range.begin > at) fn(at, range.begin, at - lb);
    if (layer >= 0) skip(static_cast<size_t>(layer));
    at = std::max(at, range.end);
  }
  if (at < le) fn(at, le, at - lb);
}

void KvShard::MarkPresent(const Segment& s, std::span<const uint32_t> absent) {
  const auto& layers = optimizer_.layers();
  ForPresent(
      s, absent,
      [&](int64_t b, int64_t e, int64_t) {
        auto it = std::upper_bound(layers.begin(), layers.end(), b,
                                   [](int64_t at, const OptimizerLayer& l) { return at < l.begin; });
        for (--it; it != layers.end() && it->begin < e; ++it) present_[static_cast<size_t>(it - layers.begin())] = 1;
      },
      [](size_t) {});
}

Status KvShard::Validate(std::span<const Segment> segments, std::span<const uint64_t> keys,
                         const size_t* num_values) const {
  uint64_t total = keys.size();
  int64_t previous_end = range_.begin;
  for (const auto& s : segments) {
    if (s.end < s.begin || s.begin < range_.begin || s.end > range_.end) {
      return InvalidArgumentError("segment [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                                  ") is outside this shard's range [" + std::to_string(range_.begin) + ", " +
                                  std::to_string(range_.end) + ")");
    }
    // Sorted and disjoint (as every sender cuts them): so a request addresses at most the
    // shard's range, and a small header cannot ask for a reply many times the shard's size.
    if (s.begin < previous_end) {
      return InvalidArgumentError("segment [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                                  ") overlaps or precedes the one before it (segments must be sorted and disjoint)");
    }
    previous_end = s.end;
    total += static_cast<uint64_t>(s.size());
  }
  if (!KeysValid(keys)) {
    // Something is wrong: the first bad key, named.
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint64_t k = keys[i];
      if (k < static_cast<uint64_t>(range_.begin) || k >= static_cast<uint64_t>(range_.end)) {
        return InvalidArgumentError("key " + std::to_string(k) + " is outside this shard's range");
      }
      if (i > 0 && k <= keys[i - 1]) return InvalidArgumentError("keys are not sorted and unique");
      const int64_t local = static_cast<int64_t>(k) - range_.begin;
      bool sparse = std::any_of(sparse_runs_.begin(), sparse_runs_.end(),
                                [&](const Segment& r) { return local >= r.begin && local < r.end; });
      if (!sparse) return InvalidArgumentError("key " + std::to_string(k) + " is not in a sparse tensor");
    }
    return InternalError("keys refused, but no key is wrong");  // unreachable: KeysValid and this loop agree
  }
  if (num_values && *num_values != total) {
    return InvalidArgumentError("request addresses " + std::to_string(total) + " values but carries " +
                                std::to_string(*num_values));
  }
  return OkStatus();
}

bool KvShard::KeysValid(std::span<const uint64_t> keys) const {
  // Sorted and unique: one branch-free pass (the common case is a valid request).
  bool descending = false;
  for (size_t i = 1; i < keys.size(); ++i) descending |= keys[i] <= keys[i - 1];
  if (descending) return false;
  // Sorted keys lie in the sparse runs (sorted, disjoint, inside the range) when none falls
  // before a run or between two: per run, the keys below its end must start at or after its begin.
  size_t pos = 0;
  for (const Segment& r : sparse_runs_) {
    const auto begin = static_cast<uint64_t>(range_.begin + r.begin), end = static_cast<uint64_t>(range_.begin + r.end);
    if (pos < keys.size() && keys[pos] < begin) return false;
    pos = static_cast<size_t>(std::lower_bound(keys.begin() + static_cast<std::ptrdiff_t>(pos), keys.end(), end) -
                              keys.begin());
  }
  return pos == keys.size();
}

void KvShard::SetValues(std::span<const float> values) {
  GRADSYNC_CHECK(values.size() == params_->size());
  Own();
  std::copy(values.begin(), values.end(), params_->begin());
}

void KvShard::Read(std::span<const Segment> segments, std::span<const uint64_t> keys, float* out) const {
  for (const auto& s : segments) {
    const float* src = params_->data() + (s.begin - range_.begin);
    out = std::copy(src, src + s.size(), out);
  }
  for (uint64_t k : keys) *out++ = (*params_)[k - static_cast<uint64_t>(range_.begin)];
}

void KvShard::StepDense(int64_t local, std::span<const float> g, float lr, float grad_scale, float* clear) {
  auto piece = [&](size_t b, size_t e) {
    optimizer_.Step(std::span<float>(params_->data() + local + static_cast<int64_t>(b), e - b), g.subspan(b, e - b), lr,
                    local + static_cast<int64_t>(b), grad_scale);
    if (clear != nullptr) std::fill(clear + b, clear + e, 0.0f);
  };
  // Below a few hundred thousand elements waking threads costs more than it saves.
  constexpr size_t kMinPiece = size_t{1} << 18;
  if (layer_wise_) {
    // LARS, LAMB: a layer's norms are over all of it (its part in this shard), so the run is
    // cut at layer boundaries only, one layer per Step call, the layers spread over the threads.
    if (parallel_ == nullptr || g.size() < 2 * kMinPiece) {
      piece(0, g.size());
      return;
    }
    const int64_t end = local + static_cast<int64_t>(g.size());
    layer_cuts_.clear();
    for (const OptimizerLayer& l : optimizer_.layers()) {
      const int64_t b = std::max(l.begin, local), e = std::min(l.end, end);
      if (b < e) layer_cuts_.push_back({b - local, e - local});
    }
    parallel_->Run(layer_cuts_.size(), 1, [&](size_t first, size_t last) {
      for (size_t i = first; i < last; ++i) {
        piece(static_cast<size_t>(layer_cuts_[i].begin), static_cast<size_t>(layer_cuts_[i].end));
      }
    });
    return;
  }
  if (parallel_ == nullptr) {
    piece(0, g.size());
  } else {
    parallel_->Run(g.size(), kMinPiece, piece);
  }
}

void KvShard::Own() {
  // Another holder (a pull reply ZeroMQ is still sending) keeps the old values: they were one
  // version, and stay it.
  if (params_.use_count() > 1) params_ = std::make_shared<std::vector<float>>(*params_);
}

std::shared_ptr<const void> KvShard::Share() const { return params_; }

void KvShard::Apply(std::span<const Segment> segments, std::span<const uint64_t> keys, const float* values,
                    float lr_scale, bool counts, float pushed_lr, std::span<const uint32_t> absent) {
  Own();
  const float lr = Lr(pushed_lr) * lr_scale * push_lr_scale_;
  auto skip = [&](size_t layer) { optimizer_.SkipLayer(layer); };
  if (layer_wise_) {
    // LARS, LAMB: a push's parts may cut a layer, so its dense values are gathered until its
    // last part and applied then, each layer in one piece (dense models only: no keys).
    GRADSYNC_CHECK(keys.empty()) << OptimizerKindName(optimizer_.options().kind) << " takes dense pushes only";
    if (pending_.size() != params_->size()) pending_.assign(params_->size(), 0.0f);
    for (const auto& s : segments) {
      ForPresent(
          s, absent,
          [&](int64_t b, int64_t e, int64_t at) {
            std::copy(values + at, values + at + (e - b), pending_.data() + b);
            pending_runs_.push_back({b, e});
          },
          skip);
      values += s.size();
    }
    if (!counts) return;
    std::sort(pending_runs_.begin(), pending_runs_.end(), [](const Segment& x, const Segment& y) { return x.begin < y.begin; });
    size_t i = 0;
    while (i < pending_runs_.size()) {
      Segment run = pending_runs_[i++];
      while (i < pending_runs_.size() && pending_runs_[i].begin == run.end) run.end = pending_runs_[i++].end;
      StepDense(run.begin, std::span<const float>(pending_.data() + run.begin, static_cast<size_t>(run.size())), lr,
                push_grad_scale_, nullptr);
    }
    pending_runs_.clear();
  }
  for (const auto& s : layer_wise_ ? std::span<const Segment>() : segments) {
    ForPresent(
        s, absent,
        [&](int64_t b, int64_t e, int64_t at) {
          StepDense(b, std::span<const float>(values + at, static_cast<size_t>(e - b)), lr, push_grad_scale_, nullptr);
        },
        skip);
    values += s.size();
  }
  if (!keys.empty()) {
    local_keys_.resize(keys.size());
    scratch_.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      local_keys_[i] = keys[i] - static_cast<uint64_t>(range_.begin);
      scratch_[i] = values[i] * push_grad_scale_;
    }
    optimizer_.StepSparse(*params_, local_keys_, scratch_, lr);
  }
  if (!counts) return;
  optimizer_.EndStep();
  ++version_;
  ++gradients_;
  step_ = gradients_ / num_workers_;
}

void KvShard::Accumulate(std::span<const Segment> segments, std::span<const uint64_t> keys, const float* values,
                         std::span<const uint32_t> absent) {
  for (const auto& s : segments) {
    ForPresent(
        s, absent,
        [&](int64_t b, int64_t e, int64_t at) {
          float* a = accum_.data() + b;
          const float* v = values + at;
          for (int64_t i = 0; i < e - b; ++i) a[i] += v[i];
        },
        [](size_t) {});
    MarkPresent(s, absent);
    values += s.size();
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t local = keys[i] - static_cast<uint64_t>(range_.begin);
    accum_[local] += values[i];
    if (!touched_[local]) {
      touched_[local] = 1;
      touched_keys_.push_back(local);
    }
  }
}

void KvShard::ApplyAccumulated(int count, float pushed_lr) {
  GRADSYNC_CHECK(count > 0);
  Own();
  const float lr = Lr(pushed_lr);
  const float inv = 1.0f / static_cast<float>(count);
  const auto& layers = optimizer_.layers();
  for (const auto& r : dense_runs_) {
    // The run's layers that the round carries a gradient for, in maximal stretches (all of the
    // run when every push carried every tensor); the others skip the step.
    auto it = std::upper_bound(layers.begin(), layers.end(), r.begin,
                               [](int64_t at, const OptimizerLayer& l) { return at < l.begin; });
    int64_t from = -1;  // start of the present stretch
    for (--it; it != layers.end() && it->begin < r.end; ++it) {
      const size_t l = static_cast<size_t>(it - layers.begin());
      const int64_t b = std::max(r.begin, it->begin), e = std::min(r.end, it->end);
      if (present_[l]) {
        if (from < 0) from = b;
      } else {
        if (from >= 0) {
          float* a = accum_.data() + from;
          StepDense(from, std::span<const float>(a, static_cast<size_t>(b - from)), lr, inv, /*clear=*/a);
          from = -1;
        }
        optimizer_.SkipLayer(l);
        std::fill(accum_.data() + b, accum_.data() + e, 0.0f);
      }
    }
    if (from >= 0) {
      float* a = accum_.data() + from;
      StepDense(from, std::span<const float>(a, static_cast<size_t>(r.end - from)), lr, inv, /*clear=*/a);
    }
  }
  std::fill(present_.begin(), present_.end(), 0);
  if (!touched_keys_.empty()) {
    std::sort(touched_keys_.begin(), touched_keys_.end());
    scratch_.resize(touched_keys_.size());
    for (size_t i = 0; i < touched_keys_.size(); ++i) {
      scratch_[i] = accum_[touched_keys_[i]] * inv;
      accum_[touched_keys_[i]] = 0.0f;
      touched_[touched_keys_[i]] = 0;
    }
    optimizer_.StepSparse(*params_, touched_keys_, scratch_, lr);
    touched_keys_.clear();
  }
  optimizer_.EndStep();
  version_ += count;
  gradients_ += count;
  ++step_;
}

Status KvShard::SetOptimizerState(std::span<const float> state, int64_t steps, std::span<const int64_t> skipped) {
  const size_t n = params_->size();
  const OptimizerKind kind = optimizer_.options().kind;
  if (state.size() != optimizer_.state().size()) {
    return InvalidArgumentError("an optimizer state of " + std::to_string(state.size()) + " values; this shard's " +
                                OptimizerKindName(kind) + " keeps " + std::to_string(optimizer_slots()) + " vector(s) of " +
                                std::to_string(n));
  }
  if (steps < 0 || steps > (int64_t{1} << 62)) {
    return InvalidArgumentError("optimizer steps " + std::to_string(steps) + " out of range");
  }
  for (int k = 0; k < optimizer_slots(); ++k) {
    RETURN_IF_ERROR(CheckOptimizerSlot(kind, k, state.subspan(static_cast<size_t>(k) * n, n)));
  }
  RETURN_IF_ERROR(CheckSkippedSteps(skipped, optimizer_.layers().size(), steps));
  optimizer_.SetState(state);
  optimizer_.set_steps(steps);
  optimizer_.set_skipped(skipped);
  return OkStatus();
}

Status KvShard::CheckParams(std::span<const float> params) const {
  if (params.size() != params_->size()) {
    return InvalidArgumentError("a parameter set of " + std::to_string(params.size()) + " values; this shard holds " +
                                std::to_string(params_->size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!std::isfinite(params[i])) {
      return InvalidArgumentError("parameter " + std::to_string(range_.begin + static_cast<int64_t>(i)) +
                                  " of the set is not finite");
    }
  }
  return OkStatus();
}

Status KvShard::SetParams(std::span<const float> params) {
  RETURN_IF_ERROR(CheckParams(params));
  Own();  // a pull reply may still be sending the old values
  std::copy(params.begin(), params.end(), params_->begin());
  return OkStatus();
}

Status KvShard::Restore(std::span<const float> params, std::span<const float> optimizer_state,
                        int64_t optimizer_steps, int64_t version, int64_t step, int64_t gradients,
                        std::span<const int64_t> optimizer_skipped) {
  if (params.size() != params_->size()) {
    return DataLossError("checkpoint holds " + std::to_string(params.size()) + " parameters, the shard " +
                         std::to_string(params_->size()));
  }
  if (optimizer_state.size() != optimizer_.state().size()) {
    return DataLossError("checkpoint's optimizer state has " + std::to_string(optimizer_state.size()) +
                         " values; this shard's " + OptimizerKindName(optimizer_.options().kind) + " keeps " +
                         std::to_string(optimizer_.state().size()));
  }
  // Counters go up by one per update: a negative one, or one that could overflow, is no shard's.
  constexpr int64_t kMaxCount = int64_t{1} << 62;
  for (const int64_t c : {version, step, gradients, optimizer_steps}) {
    if (c < 0 || c > kMaxCount) return DataLossError("checkpoint has a counter out of range: " + std::to_string(c));
  }
  if (Status st = CheckSkippedSteps(optimizer_skipped, optimizer_.layers().size(), optimizer_steps); !st.ok()) {
    return DataLossError("checkpoint's optimizer: " + st.message());
  }
  Own();
  std::copy(params.begin(), params.end(), params_->begin());
  optimizer_.SetState(optimizer_state);
  optimizer_.set_steps(optimizer_steps);
  optimizer_.set_skipped(optimizer_skipped);
  version_ = version;
  step_ = step;
  gradients_ = gradients;
  return OkStatus();
}

}  // namespace gradsync
