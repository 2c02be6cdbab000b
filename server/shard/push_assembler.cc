#include "server/shard/push_assembler.h"

#include <algorithm>
#include <cstring>

namespace gradsync {

PushChunk TakeChunk(std::vector<Segment> segments, std::span<const uint64_t> keys, Frame* received,
                    const float* values, size_t n, std::vector<float>* decoded) {
  PushChunk c;
  c.segments = std::move(segments);
  c.keys.assign(keys.begin(), keys.end());
  // A frame's bytes are kept where they are (heap memory that moves with the frame), unless
  // they are few (ZeroMQ keeps a small message's bytes inside the message object, which moves)
  // or not float-aligned: then they are copied.
  constexpr size_t kInlineBytes = 64;
  if (values == received->data() && n * sizeof(float) > kInlineBytes &&
      reinterpret_cast<uintptr_t>(values) % alignof(float) == 0) {
    c.frame = std::move(*received);
  } else if (values == decoded->data() && n > 0) {
    c.owned.swap(*decoded);  // a decoded push: its buffer changes hands
  } else {
    c.owned.resize(std::max<size_t>(n, 1));  // never empty: values() reads owned
    if (n > 0) std::memcpy(c.owned.data(), values, n * sizeof(float));
  }
  return c;
}

bool PushAssembler::IsRestOfFailed(int worker, const PsRequest& part) const {
  if (part.parts <= 1 || part.part == 0) return false;
  auto it = partial_.find(worker);
  return it != partial_.end() && it->second.failed && it->second.clock == part.clock &&
         it->second.parts == part.parts;
}

Status PushAssembler::Check(int worker, const PsRequest& part, size_t num_keys) const {
  auto it = partial_.find(worker);
  const Partial* p = it == partial_.end() ? nullptr : &it->second;
  if (part.part > 0 && (!p || p->parts == 0 || p->clock != part.clock || p->parts != part.parts)) {
    return InvalidArgumentError("push part " + std::to_string(part.part) + " of clock " + std::to_string(part.clock) +
                                " without its first part");
  }
  const int next = part.part == 0 ? 0 : p->next;
  if (part.part != next) {
    return InvalidArgumentError("push part " + std::to_string(part.part) + " arrived where part " +
                                std::to_string(next) + " was due");
  }
  if (part.part > 0 && part.version != p->version) {
    return InvalidArgumentError("the parts of one push carry different versions");
  }
  if (part.part > 0 && !(part.lr == p->push.lr || (std::isnan(part.lr) && std::isnan(p->push.lr)))) {
    return InvalidArgumentError("the parts of one push carry different learning rates");
  }
  if (!part.codec.empty() || num_keys > 0) {
    return InvalidArgumentError("a push in parts carries dense raw values only (no codec, no keys)");
  }
  // No element twice: a part's segments may not overlap an earlier part's.
  if (part.part > 0) {
    for (const Segment& sg : part.segments) {
      auto at = std::lower_bound(p->covered.begin(), p->covered.end(), sg,
                                 [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
      const bool hits_next = at != p->covered.end() && at->begin < sg.end;
      const bool hits_prev = at != p->covered.begin() && std::prev(at)->end > sg.begin;
      if (hits_next || hits_prev) {
        return InvalidArgumentError("push part " + std::to_string(part.part) + " repeats elements of an earlier part");
      }
    }
  }
  return OkStatus();
}

HeldPush* PushAssembler::Add(int worker, const PsRequest& part, PushChunk chunk) {
  Partial& p = partial_[worker];
  if (part.part == 0) {
    p = Partial();
    p.clock = part.clock;
    p.version = part.version;
    p.parts = part.parts;
    p.push.lr = part.lr;
  }
  for (const Segment& sg : part.segments) {
    auto at = std::lower_bound(p.covered.begin(), p.covered.end(), sg,
                               [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
    p.covered.insert(at, sg);
  }
  p.push.chunks.push_back(std::move(chunk));
  if (++p.next < p.parts) return nullptr;
  return &p.push;
}

void PushAssembler::Failed(int worker, const PsRequest& part) {
  Partial& p = partial_[worker];
  p = Partial();
  p.clock = part.clock;
  p.parts = part.parts;
  p.failed = true;
}

}  // namespace gradsync
