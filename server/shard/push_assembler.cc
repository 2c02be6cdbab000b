#include "server/shard/push_assembler.h"

#include <algorithm>
#include <cstring>

namespace gradsync {

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
  if (part.part > 0 && part.push.version != p->version) {
    return InvalidArgumentError("the parts of one push carry different versions");
  }
  if (part.part > 0 && !(part.push.lr == p->push.lr || (std::isnan(part.push.lr) && std::isnan(p->push.lr)))) {
    return InvalidArgumentError("the parts of one push carry different learning rates");
  }
  if (!part.codec.empty() || (num_keys > 0 && part.tables.empty())) {
    return InvalidArgumentError("a push in parts carries dense raw values or table rows only (no codec, no keys)");
  }
  if (!part.tables.empty() && part.part + 1 != part.parts) {
    // Its rows' room under the tables' bounds is checked as it arrives and used as the push
    // counts, with nothing between: the last part.
    return InvalidArgumentError("push part " + std::to_string(part.part) + " of " + std::to_string(part.parts) +
                                " carries table rows, which come in a push's last part");
  }
  if (part.part > 0) {
    for (const TableRun& r : part.tables) {
      if (std::find(p->tables.begin(), p->tables.end(), r.table) != p->tables.end()) {
        return InvalidArgumentError("push part " + std::to_string(part.part) + " repeats the rows of table " +
                                    std::to_string(r.table) + " of an earlier part");
      }
    }
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
    p.version = part.push.version;
    p.parts = part.parts;
    p.push.lr = part.push.lr;
  }
  for (const Segment& sg : part.segments) {
    auto at = std::lower_bound(p.covered.begin(), p.covered.end(), sg,
                               [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
    p.covered.insert(at, sg);
  }
  for (const TableRun& r : part.tables) p.tables.push_back(r.table);
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
