#include "server/scheduler/shard_copies.h"

#include <algorithm>

#include "common/base/clock.h"
#include "server/replication/replication.h"

namespace gradsync {

const ServerSlot* ShardCopies::ShardServer(const std::vector<ServerSlot>& servers,
                                           int shard) const {
  for (const auto& s : servers)
    if (!s.standby && s.rank == shard) return &s;
  return nullptr;
}

bool ShardCopies::ServesShard(const std::vector<ServerSlot>& servers, int id, int shard) const {
  const ServerSlot* s = ShardServer(servers, shard);
  return s != nullptr && !s->dead && of_slot_.at(s->slot).id == id;
}

bool ShardCopies::BacksUp(const ServerSlot& s, int shard) const {
  if (s.standby) return true;
  const std::vector<int> backups = BackupRanks(shard, replicas_, num_servers_);
  return std::find(backups.begin(), backups.end(), s.rank) != backups.end();
}

std::vector<const ServerSlot*> ShardCopies::TakeoverOrder(const std::vector<ServerSlot>& servers,
                                                          int shard) const {
  std::vector<const ServerSlot*> order;
  for (const int r : BackupRanks(shard, replicas_, num_servers_)) {
    for (const auto& s : servers)
      if (!s.standby && s.rank == r) order.push_back(&s);
  }
  for (const auto& s : servers)
    if (s.standby) order.push_back(&s);
  return order;
}

void ShardCopies::Start(const std::vector<ServerSlot>& servers) {
  for (const auto& s : servers) {
    Process& p = of_slot_[s.slot];
    p.id = processes_++;
    for (int shard = 0; shard < num_servers_; ++shard) {
      if (shard != s.rank && BacksUp(s, shard)) p.copies.insert(shard);
    }
  }
}

void ShardCopies::Rejoined(const std::vector<ServerSlot>& servers, size_t slot, bool adopted) {
  Process& p = of_slot_[slot];
  p.copies.clear();
  p.id = -1;
  const ServerSlot* me = nullptr;
  for (const auto& s : servers)
    if (s.slot == slot) me = &s;
  if (adopted && me != nullptr) {
    for (const ServerSlot* b : TakeoverOrder(servers, me->rank)) {
      Process& from = of_slot_[b->slot];
      if (b->dead || !ProcessLives(from.id)) continue;
      p.id = from.id;
      from.copies.erase(me->rank);
      break;
    }
  }
  if (p.id < 0) p.id = processes_++;
}

void ShardCopies::NewStandby(size_t slot) {
  Process& p = of_slot_[slot];
  p.copies.clear();
  p.id = processes_++;
}

void ShardCopies::Announced(const std::vector<ServerSlot>& servers, size_t slot) {
  const ServerSlot* me = nullptr;
  for (const auto& s : servers)
    if (s.slot == slot) me = &s;
  if (me == nullptr) return;
  Process& p = of_slot_[slot];
  // The primaries alive now hear NODE_JOINED and send it their snapshots. (One that died unseen
  // sends nothing: the copy is missing, and NoLiveCopy finds it so when no takeover comes.)
  for (int shard = 0; shard < num_servers_; ++shard) {
    const ServerSlot* primary = ShardServer(servers, shard);
    if (primary == nullptr || primary == me || primary->dead ||
        !ProcessLives(of_slot_[primary->slot].id))
      continue;
    if (BacksUp(*me, shard) && !ServesShard(servers, p.id, shard)) p.copies.insert(shard);
  }
  // Serving a shard (restored, taken over, or as it was after a pause), it sends each live backup
  // of it in another process its snapshot.
  if (me->standby) return;
  for (const ServerSlot* b : TakeoverOrder(servers, me->rank)) {
    Process& other = of_slot_[b->slot];
    if (!b->dead && ProcessLives(other.id) && other.id != p.id) other.copies.insert(me->rank);
  }
}

void ShardCopies::Died(size_t slot) { dead_processes_.insert(of_slot_[slot].id); }

std::optional<std::string> ShardCopies::NoLiveCopy(const std::vector<ServerSlot>& servers,
                                                   int shard, double now) {
  const ServerSlot* primary = ShardServer(servers, shard);
  if (primary == nullptr || !primary->dead) return std::nullopt;
  // The first live server in the shard's order takes it over (ShardReplication::TakeOver), from
  // its copy; a server of a process that died is passed over, as it will be declared dead too.
  std::string dead = primary->name;
  const ServerSlot* next = nullptr;
  for (const ServerSlot* b : TakeoverOrder(servers, shard)) {
    if (b->dead) {
      if (!b->standby) dead += " and its backup " + b->name;
    } else if (next == nullptr && ProcessLives(of_slot_[b->slot].id)) {
      next = b;
    }
  }
  dead += " dead";
  if (next != nullptr && of_slot_[next->slot].copies.count(shard)) {
    auto [t, fresh] = takeovers_.try_emplace(shard, Takeover{next->slot, now + kTakeoverGraceS});
    if (!fresh && t->second.slot != next->slot)
      t->second = Takeover{next->slot, now + kTakeoverGraceS};
    if (now < t->second.due) return std::nullopt;
    dead += "; " + next->name + ", next in line, did not take it over within " +
            SecondsText(kTakeoverGraceS) +
            " s (no whole copy of it reached it before its primary died)";
  } else if (next != nullptr) {
    dead += "; " + next->name +
            ", next in line, holds no copy of it (it came after the copy there was lost)";
  }
  return dead;
}

}  // namespace gradsync
