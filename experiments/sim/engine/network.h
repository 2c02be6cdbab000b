// The network: a full-duplex link per host to a switch (flat) or to its rack's switch, the racks'
// uplinks, and each sender's NIC taking turns between its connections.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <unordered_map>
#include <vector>

#include "experiments/sim/engine/cpus.h"
#include "experiments/sim/engine/engine.h"

namespace gradsync {
struct SimSettings;
}  // namespace gradsync

namespace gradsync::sim {

// What a message costs in CPU at its ends, on a shared machine: `us` both ends together, half at
// each. A PS job's ZeroMQ messages (msg_us) go through each host's I/O thread, whose one wake-up
// takes every message waiting for it, and they share its half (kShared). The ring's plain TCP
// (ring_msg_us) has no such thread: the rank's own thread sends each step's message and waits for
// the next, so every message pays its own send and its own wake-up (kEach).
struct MessageCpu {
  enum class Wakeups { kShared, kEach };
  double us = 0;
  Wakeups wakeups = Wakeups::kShared;
};

class Network {
 public:
  Network(Engine& engine, Cpus& cpus, int hosts, const SimSettings& s, MessageCpu msg, uint64_t seed);

  // Sends `bytes` (payload) from host src to dst; `deliver` runs when the last byte has arrived.
  void Send(int src, int dst, uint64_t bytes, std::function<void()> deliver);

 private:
  // Whether a message costs CPU at its ends (PS messages on a shared machine): the common case,
  // a core per process, takes no detour through the CPUs.
  bool msg_cpu() const { return msg_us_ > 0 && cpus_.shared(); }

  void Queue(int src, int dst, int id);

  // A link serves chunks first come, first served at `rate`; with a token bucket (tc tbf's
  // burst), bytes the bucket holds pass at the host's own speed (`peak`) instead.
  struct Link {
    double rate;  // payload bytes per microsecond
    Time free_at = 0;
    double burst = 0;  // the bucket's size (payload bytes); 0: none
    double tokens = 0;
    Time filled_at = 0;  // tokens counted up to here
    // When `bytes` that may start at `start` have passed (the link is free from free_at).
    Time Pass(Time start, double bytes, double peak);
  };
  struct Msg {
    int src = 0, dst = 0;
    double left = 0;      // not yet sent by the sender's NIC
    double quantum = 0;   // its connection's turn on the sender's NIC (bytes)
    double arriving = 0;  // not yet arrived
    std::function<void()> deliver;
    bool ready = false;  // on a shared machine: arrived and taken in, its turn to be handed on not yet come
    Time ready_at = 0;
  };
  static int64_t Connection(int src, int dst) { return (static_cast<int64_t>(src) << 32) | static_cast<uint32_t>(dst); }
  // A sender's messages: one connection per peer (a TCP stream: its messages in order), the
  // connections taking turns on the NIC.
  struct Tx {
    std::map<int, std::deque<int>> queues;  // peer -> message ids
    std::deque<int> turn;                   // peers with a message queued, in turn order
    bool busy = false;
  };

  int Rack(int h) const { return rack_size_ > 0 ? h / rack_size_ : 0; }

  // A connection's turn on its sender's NIC: quantum_ x (1 ± spread_), the same for the
  // connection's whole life, drawn from (seed, src, dst) (TCP flows that share a link do not
  // share it evenly, and a flow that gets less keeps getting less). Where the connection's
  // messages meet others at a receiver's link, their bytes arrive, and are served, in proportion.
  double Quantum(int src, int dst) const;

  // The sender's NIC takes turns between its connections, a chunk at a time.
  void NextChunk(int src);

  // A chunk's first packet reaches hop `hop` of its path now; its last leaves the previous hop at
  // `last`. Hops: 1 the source rack's uplink (crossing racks), 2 the destination rack's downlink,
  // 3 the receiver's link.
  void Hop(int id, double chunk, int hop, Time last);

  // On a shared machine a message is handed on in its connection's order, as a TCP stream is: the
  // kernel's copies and the I/O thread share the cores, so a short message taken in beside a long
  // one could otherwise overtake it.
  void HandOn(int id, Time arrived);

  Engine& engine_;
  Cpus& cpus_;
  double latency_;
  double quantum_;
  double spread_;
  uint64_t seed_;
  double kernel_us_per_byte_;  // at each end
  double msg_us_;              // at each end
  bool shared_wakeups_;        // MessageCpu::Wakeups::kShared
  double peak_;
  int rack_size_ = 0;
  std::vector<Link> up_, down_, rack_up_, rack_down_;
  std::vector<Tx> tx_;
  std::deque<Msg> msgs_;
  std::vector<int> free_;
  // Shared machine, a PS message's CPU (kShared): per host, the messages waiting for its I/O thread
  // to wake, sending and receiving (one wake-up, half of msg_us at that end, takes them all).
  struct Batch {
    std::vector<int> ids;
    std::vector<Time> arrived;
  };
  std::vector<Batch> send_batch_, recv_batch_;
  // Shared machine: (src, dst) -> its messages not yet handed on, in send order (kept when empty:
  // a job has few connections, and each message would otherwise build a deque anew).
  std::unordered_map<int64_t, std::deque<int>> connections_;
};

}  // namespace gradsync::sim
