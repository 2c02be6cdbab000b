#include "experiments/sim/engine/network.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "common/base/numeric/rng.h"
#include "experiments/sim/sim.h"

namespace gradsync::sim {
namespace {

constexpr double kPacketBytes = 1448;  // a TCP segment's payload at MTU 1500

}  // namespace

Network::Network(Engine& engine, Cpus& cpus, int hosts, const SimSettings& s, MessageCpu msg, uint64_t seed)
    : engine_(engine),
      cpus_(cpus),
      latency_(s.latency_us),
      quantum_(s.quantum_bytes),
      spread_(s.flow_share_spread),
      seed_(seed),
      kernel_us_per_byte_(s.net_ns_per_byte / 2 / 1e3),
      msg_us_(msg.us / 2),
      shared_wakeups_(msg.wakeups == MessageCpu::Wakeups::kShared),
      tx_(static_cast<size_t>(hosts)),
      send_batch_(static_cast<size_t>(hosts)),
      recv_batch_(static_cast<size_t>(hosts)) {
  const double payload_bytes_per_us = s.link_bits_per_s / 8 / 1e6 * s.wire_efficiency;
  peak_ = s.peak_bits_per_s / 8 / 1e6 * s.wire_efficiency;
  for (int h = 0; h < hosts; ++h) {
    Link l{payload_bytes_per_us};
    l.burst = s.burst_bytes * s.wire_efficiency;
    l.tokens = l.burst;
    up_.push_back(l);
    down_.push_back(l);
  }
  rack_size_ = s.rack_size;
  if (rack_size_ > 0) {
    const int racks = (hosts + rack_size_ - 1) / rack_size_;
    const double uplink = payload_bytes_per_us * rack_size_ / s.oversubscription;
    for (int r = 0; r < racks; ++r) {
      rack_up_.push_back(Link{uplink});
      rack_down_.push_back(Link{uplink});
    }
  }
}

void Network::Send(int src, int dst, uint64_t bytes, std::function<void()> deliver) {
  int id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<int>(msgs_.size());
    msgs_.emplace_back();
  }
  Msg& m = msgs_[static_cast<size_t>(id)];
  m.src = src;
  m.dst = dst;
  m.left = std::max<double>(1, static_cast<double>(bytes));
  m.arriving = m.left;
  m.quantum = Quantum(src, dst);
  m.deliver = std::move(deliver);
  if (cpus_.shared()) {
    m.ready = false;
    connections_[Connection(src, dst)].push_back(id);
  }
  // The sender's I/O thread takes the message (on a shared machine), then its NIC queues it.
  if (!msg_cpu()) {
    Queue(src, dst, id);
    return;
  }
  if (!shared_wakeups_) {  // the sending thread's own send
    cpus_.Kernel(msg_us_, [this, src, dst, id] { Queue(src, dst, id); });
    return;
  }
  // Messages sent before the I/O thread has woken ride along with the first: one wake-up
  // takes every message waiting for it.
  Batch& b = send_batch_[static_cast<size_t>(src)];
  b.ids.push_back(id);
  if (b.ids.size() > 1) return;
  cpus_.Kernel(msg_us_, [this, src] {
    Batch taken;
    std::swap(taken, send_batch_[static_cast<size_t>(src)]);
    for (int i : taken.ids) Queue(src, msgs_[static_cast<size_t>(i)].dst, i);
  });
}

Time Network::Link::Pass(Time start, double bytes, double peak) {
  start = std::max(start, free_at);
  if (burst <= 0) return free_at = start + bytes / rate;
  tokens = std::min(burst, tokens + (start - filled_at) * rate);
  Time done;
  if (tokens >= bytes) {
    tokens -= bytes;
    done = start + bytes / peak;
  } else {
    done = std::max(start + bytes / peak, start + (bytes - tokens) / rate);
    tokens = 0;
  }
  filled_at = done;
  return free_at = done;
}

void Network::Queue(int src, int dst, int id) {
  Tx& tx = tx_[static_cast<size_t>(src)];
  auto& queue = tx.queues[dst];
  if (queue.empty()) tx.turn.push_back(dst);
  queue.push_back(id);
  if (!tx.busy) NextChunk(src);
}

double Network::Quantum(int src, int dst) const {
  if (spread_ <= 0) return quantum_;
  const uint64_t h = Rng::SplitMix64(seed_ ^ Rng::SplitMix64(static_cast<uint64_t>(Connection(src, dst))));
  const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
  return quantum_ * (1 + spread_ * (2 * u - 1));
}

void Network::NextChunk(int src) {
  Tx& tx = tx_[static_cast<size_t>(src)];
  if (tx.turn.empty()) {
    tx.busy = false;
    return;
  }
  tx.busy = true;
  const int dst = tx.turn.front();
  tx.turn.pop_front();
  auto queue = tx.queues.find(dst);
  const int id = queue->second.front();
  Msg& m = msgs_[static_cast<size_t>(id)];
  const double chunk = std::min(m.quantum, m.left);
  m.left -= chunk;
  if (m.left <= 0) queue->second.pop_front();
  if (queue->second.empty())
    tx.queues.erase(queue);
  else
    tx.turn.push_back(dst);
  Link& up = up_[static_cast<size_t>(src)];
  const Time start = std::max(engine_.now(), up.free_at);
  const Time done = up.Pass(start, chunk, peak_);
  // The next hop sees the chunk's first packet a packet's time after it started (cut-through
  // at packet granularity, as store-and-forward switches of 1.5 kB frames are).
  const Time first = start + std::min(chunk, kPacketBytes) / up.rate;
  engine_.At(first, [this, id, chunk, done] { Hop(id, chunk, 1, done); });
  if (!cpus_.shared()) {
    engine_.At(done, [this, src] { NextChunk(src); });
    return;
  }
  // On a shared machine the sender's kernel copies the chunk out as the link moves it: the
  // next chunk waits for both.
  auto left = std::make_shared<int>(2);
  auto next = [this, src, left] {
    if (--*left == 0) NextChunk(src);
  };
  cpus_.Kernel(chunk * kernel_us_per_byte_, next);
  engine_.At(done, next);
}

void Network::Hop(int id, double chunk, int hop, Time last) {
  Msg& m = msgs_[static_cast<size_t>(id)];
  const bool cross = rack_size_ > 0 && Rack(m.src) != Rack(m.dst);
  if (!cross && hop < 3) hop = 3;
  Link& link = hop == 1   ? rack_up_[static_cast<size_t>(Rack(m.src))]
               : hop == 2 ? rack_down_[static_cast<size_t>(Rack(m.dst))]
                          : down_[static_cast<size_t>(m.dst)];
  const double packet = std::min(chunk, kPacketBytes);
  const Time start = std::max(engine_.now(), link.free_at);
  const Time done = std::max(link.Pass(start, chunk, peak_), last + packet / link.rate);
  link.free_at = done;
  if (hop < 3) {
    engine_.At(start + packet / link.rate, [this, id, chunk, hop, done] { Hop(id, chunk, hop + 1, done); });
    return;
  }
  auto in = [this, id, chunk] {
    Msg& msg = msgs_[static_cast<size_t>(id)];
    msg.arriving -= chunk;
    if (msg.arriving > 0.5) return;
    if (!cpus_.shared()) {
      std::function<void()> deliver = std::move(msg.deliver);
      free_.push_back(id);
      engine_.At(engine_.now() + latency_, std::move(deliver));
      return;
    }
    // The receiver's I/O thread takes it in, with every message that arrived before it woke
    // (kShared), or the waiting thread wakes for it alone (kEach).
    const Time arrived = engine_.now();
    if (!msg_cpu()) {
      HandOn(id, arrived);
      return;
    }
    if (!shared_wakeups_) {
      cpus_.Kernel(msg_us_, [this, id, arrived] { HandOn(id, arrived); });
      return;
    }
    Batch& b = recv_batch_[static_cast<size_t>(msg.dst)];
    b.ids.push_back(id);
    b.arrived.push_back(arrived);
    if (b.ids.size() > 1) return;
    const int dst = msg.dst;
    cpus_.Kernel(msg_us_, [this, dst] {
      Batch taken;
      std::swap(taken, recv_batch_[static_cast<size_t>(dst)]);
      for (size_t i = 0; i < taken.ids.size(); ++i) HandOn(taken.ids[i], taken.arrived[i]);
    });
  };
  // On a shared machine the receiver's kernel copies the chunk in once it has arrived.
  if (cpus_.shared())
    engine_.At(done, [this, chunk, in] { cpus_.Kernel(chunk * kernel_us_per_byte_, in); });
  else
    engine_.At(done, in);
}

void Network::HandOn(int id, Time arrived) {
  Msg& m = msgs_[static_cast<size_t>(id)];
  m.ready = true;
  m.ready_at = std::max(engine_.now(), arrived + latency_);
  std::deque<int>& order = connections_[Connection(m.src, m.dst)];
  Time at = engine_.now();
  while (!order.empty() && msgs_[static_cast<size_t>(order.front())].ready) {
    const int next = order.front();
    order.pop_front();
    Msg& n = msgs_[static_cast<size_t>(next)];
    at = std::max(at, n.ready_at);
    engine_.At(at, std::move(n.deliver));
    free_.push_back(next);
  }
}

}  // namespace gradsync::sim
