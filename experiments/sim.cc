#include "experiments/sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "allreduce/plan/schedule.h"
#include "common/consistency.h"
#include "common/flags.h"
#include "common/metrics.h"
#include "common/partitioner.h"
#include "common/process_summary.h"
#include "common/ps_protocol.h"
#include "common/rng.h"
#include "common/straggler.h"
#include "compression/compressor.h"
#include "compression/gradient_encoder.h"
#include "compression/pull_delta.h"
#include "experiments/netns.h"
#include "experiments/report.h"
#include "experiments/trace_merge.h"

namespace gradsync {
namespace {

namespace fs = std::filesystem;
using Time = double;  // microseconds of simulated time

constexpr double kPacketBytes = 1448;  // a TCP segment's payload at MTU 1500
constexpr int64_t kFashionInputs = 784, kFashionClasses = 10;

// A metrics file opened and its header checked; `field` names the setting that gave it.
Result<std::ifstream> OpenMetrics(const std::string& path, const std::string& field) {
  std::ifstream f(path);
  if (!f) {
    return NotFoundError(path + ": cannot read (" + field +
                         ": the metrics of a real run, which gradsync-run writes; run the spec that measures it "
                         "first, e.g. gradsync-run experiments/specs/sim_measure.textproto)");
  }
  std::string line;
  std::getline(f, line);
  if (line != MetricsWriter::kHeader) return DataLossError(path + ": not a metrics file (its header is '" + line + "')");
  return f;
}

// The median compute_ms of a metrics file's training rows (every worker's).
Result<double> MedianComputeMs(const std::string& path) {
  ASSIGN_OR_RETURN(std::ifstream f, OpenMetrics(path, "sim.compute_from"));
  std::string line;
  std::vector<double> ms;
  while (std::getline(f, line)) {
    auto v = SplitCsv(line);
    if (v.size() != kMetricsColumns || !v[kColTestAccuracy].empty() || v[kColCompute].empty()) continue;
    try {
      ms.push_back(std::stod(v[kColCompute]));
    } catch (const std::exception&) {
      return DataLossError(path + ": a row does not parse: " + line);
    }
  }
  if (ms.empty()) return DataLossError(path + ": no training rows (sim.compute_from)");
  return Median(std::move(ms));
}

// Worker 0's evaluation rows of a metrics file: accuracy vs step.
Result<std::vector<AccuracyPoint>> AccuracyCurve(const std::string& path) {
  ASSIGN_OR_RETURN(std::ifstream f, OpenMetrics(path, "sim.accuracy_from"));
  std::string line;
  std::vector<AccuracyPoint> curve;
  while (std::getline(f, line)) {
    auto v = SplitCsv(line);
    if (v.size() != kMetricsColumns || v[kColTestAccuracy].empty() || v[kColWorker] != "0") continue;
    try {
      curve.push_back({std::stoll(v[kColStep]), std::stod(v[kColTestAccuracy])});
    } catch (const std::exception&) {
      return DataLossError(path + ": a row does not parse: " + line);
    }
  }
  if (curve.empty()) return DataLossError(path + ": no evaluation rows (sim.accuracy_from)");
  std::stable_sort(curve.begin(), curve.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return curve;
}

// Accuracy at `step`: linear between measured points, the last one held past the end.
double AccuracyAt(const std::vector<AccuracyPoint>& curve, int64_t step) {
  if (step <= curve.front().step) return curve.front().accuracy;
  for (size_t i = 1; i < curve.size(); ++i) {
    if (step <= curve[i].step) {
      const auto& a = curve[i - 1];
      const auto& b = curve[i];
      const double f = static_cast<double>(step - a.step) / static_cast<double>(std::max<int64_t>(1, b.step - a.step));
      return a.accuracy + f * (b.accuracy - a.accuracy);
    }
  }
  return curve.back().accuracy;
}

// The model's tensors (floats, forward order) from train's model: the MLP's and softmax's
// Fashion-MNIST layouts (weight, then bias, per layer).
Result<std::vector<int64_t>> ModelTensors(const config::TrainConfig& t) {
  std::vector<int64_t> sizes;
  std::vector<int64_t> widths{kFashionInputs};
  if (t.model() == "mlp") {
    ASSIGN_OR_RETURN(std::vector<int64_t> hidden, ParseIntList(t.hidden(), 1, 1 << 20));
    widths.insert(widths.end(), hidden.begin(), hidden.end());
  } else if (t.model() != "softmax") {
    return InvalidArgumentError("model '" + t.model() + "': give its tensors (sim { tensors: ... }), floats each in forward order");
  }
  if (t.has_dataset() && t.dataset() != "fashion-mnist") {
    return InvalidArgumentError("dataset '" + t.dataset() + "': give the model's tensors (sim { tensors: ... })");
  }
  widths.push_back(kFashionClasses);
  for (size_t i = 1; i < widths.size(); ++i) {
    sizes.push_back(widths[i - 1] * widths[i]);
    sizes.push_back(widths[i]);
  }
  return sizes;
}

// The median encode time per float of a traced run's `encode` spans, its workers' and its
// shards' (spans that say how many values they encoded).
Status CodecTimesFromTrace(const std::string& path, SimSettings* s) {
  ASSIGN_OR_RETURN(LoadedTrace trace, LoadTrace(path));
  std::vector<double> worker, server;
  for (const TraceEvent& e : trace.events) {
    if (e.name != "encode" || e.instant) continue;
    const double values = e.Arg("values");
    if (values <= 0) continue;
    const std::string& who = trace.processes.at(static_cast<size_t>(e.process));
    (who.rfind("worker", 0) == 0 ? worker : who.rfind("server", 0) == 0 ? server : worker).push_back(e.dur_us / values);
  }
  if (worker.empty()) return InvalidArgumentError(path + ": no worker encode spans with values (sim.codec_from needs a traced compressed run)");
  s->encode_us_per_float = Median(std::move(worker));
  if (!server.empty()) s->pull_encode_us_per_float = Median(std::move(server));
  s->codec_source = path;
  return OkStatus();
}

// ---- Codec costs, measured on this machine ----

struct CodecCost {
  size_t payload = 0;
  double encode_us = 0, decode_us = 0;        // a push: the sender's encoder, the codec's decode
  double pull_encode_us = 0, pull_decode_us = 0;  // a compressed pull: the shard's delta encoder, the worker's decoder
};

class Codecs {
 public:
  Codecs(std::string spec, bool error_feedback, float correction, double encode_us_per_float, double pull_encode_us_per_float)
      : spec_(std::move(spec)),
        error_feedback_(error_feedback),
        correction_(correction),
        encode_per_float_(encode_us_per_float),
        pull_encode_per_float_(pull_encode_us_per_float) {}
  bool on() const { return spec_ != "none" && !spec_.empty(); }
  const std::string& spec() const { return spec_; }
  // The payload of n floats and the median of 5 timed encodes and decodes of random values
  // (after 2 that warm up).
  Result<CodecCost> Cost(size_t n) {
    if (auto it = cache_.find(n); it != cache_.end()) return it->second;
    // The sender's own encoder (error feedback or momentum correction as the run has them), and
    // the codec's decode.
    ASSIGN_OR_RETURN(auto encoder, GradientEncoder::Create(spec_, 1, n, error_feedback_, correction_));
    ASSIGN_OR_RETURN(auto codec, CreateCompressor(spec_, 1));
    std::vector<float> x(n), out(n);
    Rng rng(n);
    for (auto& v : x) v = rng.Uniform(-1, 1);
    std::vector<uint8_t> payload;
    std::vector<double> enc, dec;
    for (int i = 0; i < 7; ++i) {
      Evict();
      auto t0 = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(encoder->Encode(x, static_cast<uint64_t>(i), &payload));
      auto t1 = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(codec->Decode(payload, n, static_cast<uint64_t>(i), out));
      auto t2 = std::chrono::steady_clock::now();
      if (i < 2) continue;  // warming up: buffers allocated, residual filled, as in a running worker
      enc.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      dec.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    }
    // A compressed pull: the shard's PullDeltaEncoder against its mirror of the worker, and the
    // worker's PullDeltaDecoder adding the delta to its parameters.
    ASSIGN_OR_RETURN(auto mirror_codec, CreateCompressor(spec_, 1));
    ASSIGN_OR_RETURN(auto worker_codec, CreateCompressor(spec_, 1));
    const Segment range{0, static_cast<int64_t>(n)};
    PullDeltaEncoder shard(std::move(mirror_codec), range);
    PullDeltaDecoder worker(std::move(worker_codec));
    shard.Record(0, std::span(&range, 1), out.data());
    std::vector<double> penc, pdec;
    for (int i = 0; i < 7; ++i) {
      for (auto& v : x) v += 1e-3f;
      Evict();
      auto t0 = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(bool encoded, shard.Encode(0, std::span(&range, 1), x, i, &payload));
      auto t1 = std::chrono::steady_clock::now();
      if (!encoded) return InternalError("the pull delta encoder refused a complete mirror");
      RETURN_IF_ERROR(worker.AddTo(payload, std::span(&range, 1), i, out));
      auto t2 = std::chrono::steady_clock::now();
      if (i < 2) continue;
      penc.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      pdec.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    }
    CodecCost c{payload.size(), Median(std::move(enc)), Median(std::move(dec)), Median(std::move(penc)), Median(std::move(pdec))};
    // A real run's spans, when given, instead of the encoders timed here.
    if (encode_per_float_ >= 0) c.encode_us = encode_per_float_ * static_cast<double>(n);
    if (pull_encode_per_float_ >= 0) c.pull_encode_us = pull_encode_per_float_ * static_cast<double>(n);
    cache_[n] = c;
    return c;
  }
  // What was measured, for the run's description.
  std::string Describe() const {
    std::ostringstream o;
    for (const auto& [n, c] : cache_) {
      o << (o.tellp() > 0 ? "; " : "") << spec_ << (error_feedback_ ? "+ef" : "") << " of " << n << " floats: " << c.payload << " B, encode "
        << std::lround(c.encode_us) << " us, decode " << std::lround(c.decode_us) << " us, pull delta " << std::lround(c.pull_encode_us) << " / "
        << std::lround(c.pull_decode_us) << " us";
    }
    return o.str();
  }
  bool summable() {
    auto codec = CreateCompressor(spec_, 1);
    return codec.ok() && (*codec)->aggregation() == Aggregation::kRingSummable;
  }
  // A summable payload's elements as the collective sums them: random-k's floats, else 16-bit
  // halves (BucketAverager).
  size_t summed_element_bytes() {
    auto codec = CreateCompressor(spec_, 1);
    return codec.ok() && (*codec)->sparse() ? sizeof(float) : sizeof(uint16_t);
  }

 private:
  // Codecs run in processes that share a machine's caches with others: each op is timed from
  // cold caches (a pass over 64 MiB first), not from the caches a loop of its own would warm.
  void Evict() {
    evict_.resize(16u << 20);
    float sum = 0;
    for (size_t i = 0; i < evict_.size(); i += 16) sum += (evict_[i] += 1.0f);
    sink_ = sink_ + sum;
  }
  std::vector<float> evict_;
  volatile float sink_ = 0;
  std::string spec_;
  bool error_feedback_;
  float correction_;
  double encode_per_float_, pull_encode_per_float_;
  std::map<size_t, CodecCost> cache_;
};

// ---- The engine: events in time order (ties in the order scheduled) ----

class Engine {
 public:
  void At(Time t, std::function<void()> f) { q_.push(Ev{t, seq_++, std::move(f)}); }
  void Run() {
    while (!q_.empty()) {
      Ev e = std::move(const_cast<Ev&>(q_.top()));
      q_.pop();
      now_ = e.t;
      ++events_;
      e.f();
    }
  }
  Time now() const { return now_; }
  int64_t events() const { return events_; }

 private:
  struct Ev {
    Time t;
    uint64_t seq;
    std::function<void()> f;
    bool operator>(const Ev& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  std::priority_queue<Ev, std::vector<Ev>, std::greater<>> q_;
  uint64_t seq_ = 0;
  Time now_ = 0;
  int64_t events_ = 0;
};

// ---- CPUs: a core per host, or cores shared by every host ----

// Work runs on a host's own thread, one piece after another (a process's main thread), or beside
// every thread (the kernel's copies). With a core per host, a piece runs as soon as the host's
// earlier work has. With `shared_cores` shared by every host (a job on one machine), the runnable
// pieces share them as the kernel's scheduler shares a machine: each progresses at
// min(1, cores / runnable), so a short piece gets through while long ones run, slowed.
class Cpus {
 public:
  Cpus(Engine& engine, int hosts, int shared_cores, double usable_cores)
      : engine_(engine),
        cores_(std::max(0, shared_cores)),
        usable_(usable_cores > 0 ? usable_cores : cores_),
        host_free_(static_cast<size_t>(hosts), 0),
        busy_us_(static_cast<size_t>(hosts), 0),
        queued_(static_cast<size_t>(hosts)),
        host_running_(static_cast<size_t>(hosts), false) {}

  // Runs `us` of host h's work after its earlier work; then `done`.
  void Run(int h, double us, std::function<void()> done) {
    if (us <= 0) {  // nothing to run: not behind the host's earlier work either
      engine_.At(engine_.now(), std::move(done));
      return;
    }
    busy_us_[static_cast<size_t>(h)] += us;
    if (cores_ == 0) {
      const Time start = std::max(engine_.now(), host_free_[static_cast<size_t>(h)]);
      host_free_[static_cast<size_t>(h)] = start + us;
      engine_.At(start + us, std::move(done));
      return;
    }
    Task t{us, h, std::move(done)};
    if (host_running_[static_cast<size_t>(h)]) {
      queued_[static_cast<size_t>(h)].push_back(std::move(t));
      return;
    }
    host_running_[static_cast<size_t>(h)] = true;
    Add(std::move(t));
  }
  // Work of no process's own thread (the kernel moving a message) on the shared cores, then
  // `done`; without shared cores it costs nothing: `done` now.
  void Kernel(double us, std::function<void()> done) {
    if (cores_ == 0 || us <= 0) {
      done();
      return;
    }
    kernel_us_ += us;
    Add(Task{us, -1, std::move(done)});
  }
  bool shared() const { return cores_ > 0; }
  // The CPU time modelled so far: host h's own threads, and the kernel's on the shared cores.
  double busy_us(int h) const { return busy_us_[static_cast<size_t>(h)]; }
  double kernel_us() const { return kernel_us_; }

 private:
  struct Task {
    double left;  // microseconds of CPU still to run
    int host;     // -1: the kernel's
    std::function<void()> done;
  };
  double Rate() const {
    return running_.empty() ? 1.0 : std::min(1.0, usable_ / static_cast<double>(running_.size()));
  }
  // Brings every running task's `left` up to now.
  void Advance() {
    const double ran = (engine_.now() - updated_) * Rate();
    if (ran > 0)
      for (Task& t : running_) t.left -= ran;
    updated_ = engine_.now();
  }
  void Add(Task t) {
    Advance();
    running_.push_back(std::move(t));
    Schedule();
  }
  // An event when the first running task ends; an earlier one is void once this is scheduled.
  void Schedule() {
    if (running_.empty()) return;
    double first = running_.front().left;
    for (const Task& t : running_) first = std::min(first, t.left);
    const uint64_t gen = ++gen_;
    engine_.At(engine_.now() + std::max(0.0, first) / Rate(), [this, gen] {
      if (gen == gen_) Tick();
    });
  }
  void Tick() {
    Advance();
    std::vector<std::function<void()>> ended;
    const double rate = Rate();
    for (size_t i = 0; i < running_.size();) {
      // Done: nothing left, or too little to move the clock (late in a long run, a microsecond's
      // fraction no longer does).
      if (running_[i].left > 1e-6 && engine_.now() + running_[i].left / rate > engine_.now()) {
        ++i;
        continue;
      }
      ended.push_back(std::move(running_[i].done));
      const int h = running_[i].host;
      running_[i] = std::move(running_.back());
      running_.pop_back();
      if (h < 0) continue;
      auto& q = queued_[static_cast<size_t>(h)];
      if (q.empty()) {
        host_running_[static_cast<size_t>(h)] = false;
      } else {
        running_.push_back(std::move(q.front()));
        q.pop_front();
      }
    }
    Schedule();
    for (auto& f : ended) f();
  }

  Engine& engine_;
  int cores_;
  double usable_;  // what the running work gets of cores_ when it wants them all
  std::vector<Time> host_free_;  // a core per host: when its work so far ends
  std::vector<double> busy_us_;
  double kernel_us_ = 0;
  // Shared cores: the tasks running, each host's tasks behind its running one.
  std::vector<Task> running_;
  std::vector<std::deque<Task>> queued_;
  std::vector<bool> host_running_;
  Time updated_ = 0;
  uint64_t gen_ = 0;
};

// ---- The network ----

class Network {
 public:
  // `msg_us`: CPU per message, both ends together (ZeroMQ's; the ring's plain TCP: 0), half per wake-up
  // of a host's I/O thread, which takes every message waiting for it.
  Network(Engine& engine, Cpus& cpus, int hosts, const SimSettings& s, double msg_us, uint64_t seed)
      : engine_(engine),
        cpus_(cpus),
        latency_(s.latency_us),
        quantum_(s.quantum_bytes),
        spread_(s.flow_share_spread),
        seed_(seed),
        kernel_us_per_byte_(s.net_ns_per_byte / 2 / 1e3),
        msg_us_(msg_us / 2),
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

  // Sends `bytes` (payload) from host src to dst; `deliver` runs when the last byte has arrived.
  void Send(int src, int dst, uint64_t bytes, std::function<void()> deliver) {
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

 private:
  // Whether a message costs CPU at its ends (PS messages on a shared machine): the common case,
  // a core per process, takes no detour through the CPUs.
  bool msg_cpu() const { return msg_us_ > 0 && cpus_.shared(); }

  void Queue(int src, int dst, int id) {
    Tx& tx = tx_[static_cast<size_t>(src)];
    auto& queue = tx.queues[dst];
    if (queue.empty()) tx.turn.push_back(dst);
    queue.push_back(id);
    if (!tx.busy) NextChunk(src);
  }

  // A link serves chunks first come, first served at `rate`; with a token bucket (tc tbf's
  // burst), bytes the bucket holds pass at the host's own speed (`peak`) instead.
  struct Link {
    double rate;  // payload bytes per microsecond
    Time free_at = 0;
    double burst = 0;   // the bucket's size (payload bytes); 0: none
    double tokens = 0;
    Time filled_at = 0; // tokens counted up to here
    // When `bytes` that may start at `start` have passed (the link is free from free_at).
    Time Pass(Time start, double bytes, double peak) {
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
  };
  struct Msg {
    int src = 0, dst = 0;
    double left = 0;      // not yet sent by the sender's NIC
    double quantum = 0;   // its connection's turn on the sender's NIC (bytes)
    double arriving = 0;  // not yet arrived
    std::function<void()> deliver;
    bool ready = false;   // on a shared machine: arrived and taken in, its turn to be handed on not yet come
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
  double Quantum(int src, int dst) const {
    if (spread_ <= 0) return quantum_;
    const uint64_t h = Rng::SplitMix64(seed_ ^ Rng::SplitMix64(static_cast<uint64_t>(Connection(src, dst))));
    const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
    return quantum_ * (1 + spread_ * (2 * u - 1));
  }

  // The sender's NIC takes turns between its connections, a chunk at a time.
  void NextChunk(int src) {
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
    if (queue->second.empty()) tx.queues.erase(queue);
    else tx.turn.push_back(dst);
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

  // A chunk's first packet reaches hop `hop` of its path now; its last leaves the previous hop at
  // `last`. Hops: 1 the source rack's uplink (crossing racks), 2 the destination rack's downlink,
  // 3 the receiver's link.
  void Hop(int id, double chunk, int hop, Time last) {
    Msg& m = msgs_[static_cast<size_t>(id)];
    const bool cross = rack_size_ > 0 && Rack(m.src) != Rack(m.dst);
    if (!cross && hop < 3) hop = 3;
    Link& link = hop == 1 ? rack_up_[static_cast<size_t>(Rack(m.src))]
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
      // The receiver's I/O thread takes it in, with every message that arrived before it woke.
      const Time arrived = engine_.now();
      if (!msg_cpu()) {
        HandOn(id, arrived);
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
    if (cpus_.shared()) engine_.At(done, [this, chunk, in] { cpus_.Kernel(chunk * kernel_us_per_byte_, in); });
    else engine_.At(done, in);
  }

  // On a shared machine a message is handed on in its connection's order, as a TCP stream is: the
  // kernel's copies and the I/O thread share the cores, so a short message taken in beside a long
  // one could otherwise overtake it.
  void HandOn(int id, Time arrived) {
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

  Engine& engine_;
  Cpus& cpus_;
  double latency_;
  double quantum_;
  double spread_;
  uint64_t seed_;
  double kernel_us_per_byte_;  // at each end
  double msg_us_;              // at each end
  double peak_;
  int rack_size_ = 0;
  std::vector<Link> up_, down_, rack_up_, rack_down_;
  std::vector<Tx> tx_;
  std::deque<Msg> msgs_;
  std::vector<int> free_;
  // Shared machine, a PS message's CPU: per host, the messages waiting for its I/O thread to wake,
  // sending and receiving (one wake-up, half of msg_us at that end, takes them all).
  struct Batch {
    std::vector<int> ids;
    std::vector<Time> arrived;
  };
  std::vector<Batch> send_batch_, recv_batch_;
  // Shared machine: (src, dst) -> its messages not yet handed on, in send order (kept when empty:
  // a job has few connections, and each message would otherwise build a deque anew).
  std::unordered_map<int64_t, std::deque<int>> connections_;
};

// ---- What every simulated worker records ----

struct WorkerRecord {
  uint64_t sent = 0, received = 0;
  uint64_t shm_sent = 0, shm_received = 0;  // through shared memory, counted as the wire would
  double compute_ms = 0, comm_ms = 0, wait_ms = 0, delay_ms = 0, hidden_ms = 0;
  double version_lag = NAN, clock_staleness = NAN;
  std::unique_ptr<MetricsWriter> metrics;
  std::vector<std::pair<int64_t, double>> rows;  // training rows written: step, wall_s
};

struct Job {
  const RunPlan& plan;
  const SimSettings& s;
  Engine engine;
  std::unique_ptr<Cpus> cpus;
  std::unique_ptr<Network> net;
  std::vector<WorkerRecord> rec;
  std::vector<Straggler> stragglers;
  int64_t worker_steps = 0;

  // `share_seed`: the draw of the connections' shares of a link (flow_share_spread).
  Job(const RunPlan& p, const SimSettings& settings, int hosts, uint64_t share_seed) : plan(p), s(settings) {
    cpus = std::make_unique<Cpus>(engine, hosts, s.host_cores, s.usable_cores);
    net = std::make_unique<Network>(engine, *cpus, hosts, s, p.mode != config::ALLREDUCE ? s.msg_us : 0, share_seed);
    rec.resize(static_cast<size_t>(p.workers));
    stragglers.resize(static_cast<size_t>(p.workers));
    for (const auto& [w, st] : p.stragglers) {
      auto spec = ParseStraggler(st.spec);
      if (spec.ok()) stragglers[static_cast<size_t>(w)] = Straggler(*spec, st.seed);
    }
  }
  double epoch_of(int64_t step) const { return static_cast<double>(step) / static_cast<double>(s.steps_per_epoch); }

  // A training row of worker w after `step` steps (every log_every steps).
  Status Row(int w, int64_t step) {
    auto& r = rec[static_cast<size_t>(w)];
    const int64_t every = plan.run.train().log_every();
    if (every <= 0 || step % every != 0) return OkStatus();
    MetricsRow row;
    row.step = step;
    row.epoch = epoch_of(step);
    row.wall_s = engine.now() / 1e6;
    row.loss = NAN;
    row.bytes_sent = r.sent;
    row.bytes_received = r.received;
    row.shm_bytes_sent = r.shm_sent;
    row.shm_bytes_received = r.shm_received;
    row.compute_ms = r.compute_ms;
    row.comm_ms = r.comm_ms;
    row.wait_ms = r.wait_ms;
    row.delay_ms = r.delay_ms;
    row.hidden_ms = r.hidden_ms;
    row.version_lag = r.version_lag;
    row.clock_staleness = r.clock_staleness;
    r.rows.emplace_back(step, row.wall_s);
    return r.metrics->Write(row);
  }
  // An evaluation row of worker 0 after `step` steps: the measured curve's accuracy there. Without
  // a curve its accuracy is empty (the report reads it as a training row of the same step: its
  // bytes, the evaluation's pull included, count, its time does not).
  Status EvalRow(int64_t step) {
    auto& r = rec[0];
    MetricsRow row;
    row.step = step;
    row.epoch = epoch_of(step);
    row.wall_s = engine.now() / 1e6;
    row.bytes_sent = r.sent;
    row.bytes_received = r.received;
    row.shm_bytes_sent = r.shm_sent;
    row.shm_bytes_received = r.shm_received;
    row.test_accuracy = s.accuracy.empty() ? NAN : AccuracyAt(s.accuracy, step);
    row.test_loss = NAN;
    return r.metrics->Write(row);
  }
  bool EvalDue(int64_t step) const {
    if (step <= 0 || step >= s.steps) return false;
    if (step % s.steps_per_epoch == 0) return true;
    const int64_t every = plan.run.train().eval_every();
    return every > 0 && step % every == 0;
  }
};

// ---- The parameter server ----

// A part of a pull or push: tensor `tensor`'s elements on shard `shard` (sequential: one per
// shard, tensor -1), pushed in `parts` messages.
struct Piece {
  int shard = 0;
  Segment seg;
  int group = 0;  // the forward group whose computation waits for it
};

class PsJob {
 public:
  PsJob(Job& job, Codecs& codecs) : j_(job), codecs_(codecs) {}

  Status Build() {
    const auto& t = j_.plan.run.train();
    const int S = j_.plan.servers, N = j_.plan.workers;
    const int64_t total = j_.s.params;
    part_ = std::make_unique<Partitioner>(total, S);
    compress_ = codecs_.on();
    compress_pull_ = compress_ && t.compress_pull();
    // As PsTrainer decides per worker: a straggling worker runs without overlap, the others with
    // it where the run allows it.
    const bool overlap = t.overlap() && !compress_ && (t.model() == "mlp" || t.model() == "softmax") && t.device() == "cpu";
    // Without overlap: the whole model is one forward group, a piece per shard.
    plain_.group_floats.assign(1, total);
    for (int k = 0; k < S; ++k) plain_.pieces.push_back({k, part_->range(k), 0});
    // With overlap: a forward group per tensor, pushed in parts of push_part_mib as it ends.
    overlapped_.overlap = true;
    int64_t offset = 0;
    for (size_t ti = 0; ti < j_.s.tensors.size(); ++ti) {
      const Segment tensor{offset, offset + j_.s.tensors[ti]};
      offset += j_.s.tensors[ti];
      overlapped_.group_floats.push_back(0);
      for (int k = 0; k < S; ++k) {
        const Segment& r = part_->range(k);
        const Segment cut{std::max(r.begin, tensor.begin), std::min(r.end, tensor.end)};
        if (cut.begin >= cut.end) continue;
        const int64_t part = std::max<int64_t>(1, static_cast<int64_t>(t.push_part_mib() * 1024 * 1024 / 4));
        for (int64_t b = cut.begin; b < cut.end; b += part) overlapped_.pieces.push_back({k, {b, std::min(cut.end, b + part)}, static_cast<int>(ti)});
        overlapped_.group_floats.back() += cut.end - cut.begin;
      }
    }
    for (Layout* l : {&plain_, &overlapped_}) {
      l->parts_per_shard.assign(static_cast<size_t>(S), 0);
      for (const auto& p : l->pieces) l->parts_per_shard[static_cast<size_t>(p.shard)]++;
    }
    const config::Mode m = j_.plan.mode;
    const ConsistencyMode cm = m == config::BSP ? ConsistencyMode::kBsp : m == config::SSP ? ConsistencyMode::kSsp : ConsistencyMode::kAsp;
    for (int k = 0; k < S; ++k) shards_.push_back(std::make_unique<Shard>(cm, j_.plan.staleness, N));
    workers_.resize(static_cast<size_t>(N));
    for (int w = 0; w < N; ++w) {
      auto& wk = workers_[static_cast<size_t>(w)];
      wk.layout = overlap && j_.plan.stragglers.count(w) == 0 ? &overlapped_ : &plain_;
      wk.pending.assign(wk.layout->group_floats.size(), 0);
      wk.version.assign(static_cast<size_t>(S), 0);
      wk.pushed.assign(static_cast<size_t>(S), 0);
    }
    // Codec sizes and times, measured once per size.
    if (compress_) {
      for (int k = 0; k < S; ++k) RETURN_IF_ERROR(codecs_.Cost(static_cast<size_t>(part_->range(k).size())).status());
    }
    return OkStatus();
  }

  void Start() {
    // Worker 0 initializes every shard; every worker pulls once it has.
    auto remaining = std::make_shared<int>(j_.plan.servers);
    for (int k = 0; k < j_.plan.servers; ++k) {
      PsRequest init;
      init.type = wire::INIT;
      init.segments = {part_->range(k)};
      const uint64_t bytes = HeaderBytes(init) + 4 * static_cast<uint64_t>(part_->range(k).size());
      SendToShard(0, k, bytes, [this, k, remaining] {
        ReplyToWorker(k, 0, ReplyBytes(wire::INIT_REPLY, 0, {}), [this, remaining] {
          if (--*remaining == 0)
            for (int w = 0; w < j_.plan.workers; ++w) SendPulls(w, 0, false);
        });
      });
    }
  }

 private:
  struct Shard {
    ConsistencyController cc;
    int64_t version = 0;
    std::vector<int> parts_in;  // per worker: parts of its current push arrived
    std::vector<int64_t> push_version;  // per worker: the version its current push was computed on
    std::vector<int> round;     // aggregating: workers whose push waits for the round
    struct Held {
      int worker;
      Time since;
      std::function<void(double wait_ms)> answer;
    };
    // By clock: a pull the rule holds, every later clock's is held too (ConsistencyController:
    // answerable clocks only grow), so a push answers a prefix.
    std::multimap<int64_t, Held> held;
    Histogram lag, staleness;
    uint64_t sent = 0, received = 0;
    int64_t pushes = 0, pulls = 0;
    Shard(ConsistencyMode m, int s, int n) : cc(m, s, n), parts_in(static_cast<size_t>(n), 0), push_version(static_cast<size_t>(n), 0) {}
  };
  // How a worker cuts its model: forward groups and the pieces it pulls and pushes.
  struct Layout {
    bool overlap = false;
    std::vector<Piece> pieces;
    std::vector<int64_t> group_floats;  // per forward group
    std::vector<int> parts_per_shard;   // the pieces of one push to a shard
  };
  struct Worker {
    const Layout* layout = nullptr;
    int64_t clock = 0;
    int group = 0;               // the forward group the step waits for
    bool waiting = false;
    std::vector<int> pending;    // per group: pull pieces not yet answered
    std::vector<int64_t> version, pushed;
    Time step_start = 0;
    double step_wait_ms = 0;
    bool done = false;
  };

  int ShardHost(int k) const { return k; }
  int WorkerHost(int w) const { return j_.plan.servers + w; }

  uint64_t HeaderBytes(const PsRequest& r) const { return EncodeRequest(r).ByteSizeLong(); }
  uint64_t ReplyBytes(wire::Type type, int64_t clock, const std::vector<Segment>& segs, const std::string& codec = "") const {
    PsReply r;
    r.type = type;
    r.clock = clock;
    r.segments = segs;
    r.codec = codec;
    if (type == wire::PULL_REPLY) {
      r.version = clock * j_.plan.workers;
      r.wait_ms = 0.5;
      r.clock_staleness = 1;
    }
    return EncodeReply(r).ByteSizeLong();
  }

  void SendToShard(int w, int k, uint64_t bytes, std::function<void()> at_shard) {
    j_.rec[static_cast<size_t>(w)].sent += bytes;
    shards_[static_cast<size_t>(k)]->received += bytes;
    j_.net->Send(WorkerHost(w), ShardHost(k), bytes, std::move(at_shard));
  }
  void ReplyToWorker(int k, int w, uint64_t bytes, std::function<void()> at_worker) {
    shards_[static_cast<size_t>(k)]->sent += bytes;
    j_.rec[static_cast<size_t>(w)].received += bytes;
    j_.net->Send(ShardHost(k), WorkerHost(w), bytes, std::move(at_worker));
  }

  // Pulls for clock c: a request per piece (one per shard without overlap); `eval`: worker 0's
  // final raw pull of everything.
  void SendPulls(int w, int64_t c, bool eval) {
    auto& wk = workers_[static_cast<size_t>(w)];
    const Layout& l = *wk.layout;
    std::fill(wk.pending.begin(), wk.pending.end(), 0);
    for (const Piece& p : l.pieces) wk.pending[static_cast<size_t>(p.group)]++;
    wk.group = 0;
    wk.waiting = true;
    wk.step_start = j_.engine.now();
    wk.step_wait_ms = 0;
    for (const Piece& p : l.pieces) {
      PsRequest pull;
      pull.type = wire::PULL;
      pull.worker = w;
      pull.clock = c;
      pull.request_id = static_cast<uint64_t>(c) * l.pieces.size() + 1;
      pull.segments = {p.seg};
      const bool delta = compress_pull_ && !eval && c > 0;
      if (delta) pull.codec = codecs_.spec();
      const Piece piece = p;
      SendToShard(w, p.shard, HeaderBytes(pull), [this, w, c, piece, delta, eval] { ShardPull(piece, w, c, delta, eval); });
    }
  }

  void ShardPull(const Piece& p, int w, int64_t c, bool delta, bool eval) {
    Shard& sh = *shards_[static_cast<size_t>(p.shard)];
    auto answer = [this, p, w, c, delta, eval](double wait_ms) {
      Shard& s = *shards_[static_cast<size_t>(p.shard)];
      s.staleness[s.cc.ClockStaleness(c)]++;
      s.pulls++;
      const int64_t version = s.version;
      const int64_t staleness = s.cc.ClockStaleness(c);
      uint64_t values = 4 * static_cast<uint64_t>(p.seg.size());
      double encode_us = 0;
      if (delta) {
        const CodecCost cost = *codecs_.Cost(static_cast<size_t>(p.seg.size()));
        values = cost.payload;
        encode_us = cost.pull_encode_us;
      }
      const uint64_t bytes = ReplyBytes(wire::PULL_REPLY, c, {p.seg}, delta ? codecs_.spec() : "") + values;
      j_.cpus->Run(ShardHost(p.shard), encode_us, [this, p, w, c, bytes, version, staleness, wait_ms, delta, eval] {
        ReplyToWorker(p.shard, w, bytes, [this, p, w, c, version, staleness, wait_ms, delta, eval] {
          const double decode_us = delta ? codecs_.Cost(static_cast<size_t>(p.seg.size()))->pull_decode_us : 0;
          j_.cpus->Run(WorkerHost(w), decode_us,
                       [this, p, w, c, version, staleness, wait_ms, eval] { PullAnswered(p, w, c, version, staleness, wait_ms, eval); });
        });
      });
    };
    if (sh.cc.CanAnswerPull(w, c)) {
      answer(0);
    } else {
      sh.held.emplace(c, Shard::Held{w, j_.engine.now(), std::move(answer)});
    }
  }

  void AnswerHeld(Shard& sh) {
    while (!sh.held.empty() && sh.cc.CanAnswerPull(sh.held.begin()->second.worker, sh.held.begin()->first)) {
      auto answer = std::move(sh.held.begin()->second.answer);
      const double wait_ms = (j_.engine.now() - sh.held.begin()->second.since) / 1e3;
      sh.held.erase(sh.held.begin());
      answer(wait_ms);
    }
  }

  void PullAnswered(const Piece& p, int w, int64_t c, int64_t version, int64_t staleness, double wait_ms, bool eval) {
    auto& wk = workers_[static_cast<size_t>(w)];
    auto& r = j_.rec[static_cast<size_t>(w)];
    wk.version[static_cast<size_t>(p.shard)] = version;
    r.clock_staleness = std::isnan(r.clock_staleness) ? static_cast<double>(staleness) : std::max(r.clock_staleness, static_cast<double>(staleness));
    wk.step_wait_ms = std::max(wk.step_wait_ms, wait_ms);
    wk.pending[static_cast<size_t>(p.group)]--;
    if (eval) {
      int left = 0;
      for (int n : wk.pending) left += n;
      if (left == 0) (void)j_.EvalRow(j_.s.steps);
      return;
    }
    if (wk.waiting && wk.pending[static_cast<size_t>(wk.group)] == 0) Forward(w, c);
  }

  // The forward of group wk.group, its parameters here.
  void Forward(int w, int64_t c) {
    auto& wk = workers_[static_cast<size_t>(w)];
    wk.waiting = false;
    const std::vector<int64_t>& groups = wk.layout->group_floats;
    const double share = static_cast<double>(groups[static_cast<size_t>(wk.group)]) / static_cast<double>(TotalFloats());
    j_.cpus->Run(WorkerHost(w), 1e3 * j_.s.compute_ms * j_.s.forward_fraction * share, [this, w, c, &groups] {
      auto& k = workers_[static_cast<size_t>(w)];
      if (k.group + 1 < static_cast<int>(groups.size())) {
        k.group++;
        if (k.pending[static_cast<size_t>(k.group)] == 0) Forward(w, c);
        else k.waiting = true;
        return;
      }
      Backward(w, c, static_cast<int>(groups.size()) - 1);
    });
  }

  // The backward of group g (last first); with overlap its pieces are pushed when it ends.
  void Backward(int w, int64_t c, int g) {
    const Layout& l = *workers_[static_cast<size_t>(w)].layout;
    const double share = static_cast<double>(l.group_floats[static_cast<size_t>(g)]) / static_cast<double>(TotalFloats());
    j_.cpus->Run(WorkerHost(w), 1e3 * j_.s.compute_ms * (1 - j_.s.forward_fraction) * share, [this, w, c, g, &l] {
      if (l.overlap) PushGroup(w, c, g);
      if (g > 0) {
        Backward(w, c, g - 1);
        return;
      }
      // The straggler's delay, the same draw as the worker's, then encode and push.
      auto& r = j_.rec[static_cast<size_t>(w)];
      const double delay = j_.stragglers[static_cast<size_t>(w)].DelayMs(j_.s.compute_ms);
      r.delay_ms = delay;
      r.compute_ms = j_.s.compute_ms;
      j_.engine.At(j_.engine.now() + delay * 1e3, [this, w, c] { FinishStep(w, c); });
    });
  }

  void PushGroup(int w, int64_t c, int g) {
    for (const Piece& p : workers_[static_cast<size_t>(w)].layout->pieces)
      if (p.group == g) PushPiece(w, c, p, 0);
  }

  // A piece of the push of clock c; `encoded_payload`: a compressed payload's bytes (0: raw).
  void PushPiece(int w, int64_t c, const Piece& p, size_t encoded_payload) {
    auto& wk = workers_[static_cast<size_t>(w)];
    PsRequest push;
    push.type = wire::PUSH;
    push.worker = w;
    push.clock = c;
    push.version = wk.version[static_cast<size_t>(p.shard)];
    push.request_id = static_cast<uint64_t>(c) * wk.layout->pieces.size() + 2;
    push.segments = {p.seg};
    const int parts = wk.layout->parts_per_shard[static_cast<size_t>(p.shard)];
    if (parts > 1) {
      push.parts = parts;
      push.part = static_cast<int>(wk.pushed[static_cast<size_t>(p.shard)]++ % parts);
    }
    if (encoded_payload > 0) push.codec = codecs_.spec();
    const uint64_t values = encoded_payload > 0 ? encoded_payload : 4 * static_cast<uint64_t>(p.seg.size());
    const int64_t version = push.version;
    SendToShard(w, p.shard, HeaderBytes(push) + values, [this, w, c, p, version, encoded_payload] { ShardPush(p, w, c, version, encoded_payload > 0); });
  }

  void FinishStep(int w, int64_t c) {
    if (!workers_[static_cast<size_t>(w)].layout->overlap) {
      PushEncoded(w, c, 0);
      return;
    }
    EndStep(w, c);
  }

  // Without overlap: each shard's part in turn, encoded (compressed) and pushed, as PsClient
  // does; then the step ends.
  void PushEncoded(int w, int64_t c, size_t i) {
    const std::vector<Piece>& pieces = workers_[static_cast<size_t>(w)].layout->pieces;
    if (i == pieces.size()) {
      EndStep(w, c);
      return;
    }
    if (!compress_) {
      PushPiece(w, c, pieces[i], 0);
      PushEncoded(w, c, i + 1);
      return;
    }
    const CodecCost cost = *codecs_.Cost(static_cast<size_t>(pieces[i].seg.size()));
    j_.cpus->Run(WorkerHost(w), cost.encode_us, [this, w, c, i, &pieces, payload = cost.payload] {
      PushPiece(w, c, pieces[i], payload);
      PushEncoded(w, c, i + 1);
    });
  }

  void EndStep(int w, int64_t c) {
    auto& wk = workers_[static_cast<size_t>(w)];
    auto& r = j_.rec[static_cast<size_t>(w)];
    const double step_ms = (j_.engine.now() - wk.step_start) / 1e3;
    r.wait_ms = wk.step_wait_ms;
    r.comm_ms = std::max(0.0, step_ms - r.compute_ms - r.delay_ms - r.wait_ms);
    j_.worker_steps++;
    wk.clock = c + 1;
    (void)j_.Row(w, wk.clock);
    if (w == 0 && j_.EvalDue(wk.clock)) (void)j_.EvalRow(wk.clock);
    if (wk.clock >= j_.s.steps) {
      wk.done = true;
      if (++finished_ == j_.plan.workers) SendPulls(0, j_.s.steps, true);  // worker 0's final evaluation
      return;
    }
    SendPulls(w, wk.clock, false);
  }

  void ShardPush(const Piece& p, int w, int64_t c, int64_t version, bool compressed) {
    Shard& sh = *shards_[static_cast<size_t>(p.shard)];
    const int parts = workers_[static_cast<size_t>(w)].layout->parts_per_shard[static_cast<size_t>(p.shard)];
    double us = j_.s.apply_ns_per_byte * 4.0 * static_cast<double>(p.seg.size()) / 1e3;
    if (compressed) us += codecs_.Cost(static_cast<size_t>(p.seg.size()))->decode_us;
    j_.cpus->Run(ShardHost(p.shard), us, [this, &sh, p, w, c, version, parts] {
      if (++sh.parts_in[static_cast<size_t>(w)] < parts) return;
      sh.parts_in[static_cast<size_t>(w)] = 0;
      const Status st = sh.cc.OnPush(w, c);
      if (!st.ok()) return;  // the simulation sends only pushes the rule takes
      sh.pushes++;
      ReplyToWorker(p.shard, w, ReplyBytes(wire::PUSH_REPLY, c, {}), [] {});
      if (sh.cc.aggregates()) {
        sh.round.push_back(w);
        sh.push_version[static_cast<size_t>(w)] = version;
        if (!sh.cc.RoundComplete()) return;
        // The round's sum applied once.
        const double apply_us = j_.s.apply_ns_per_byte * 4.0 * static_cast<double>(part_->range(p.shard).size()) / 1e3;
        j_.cpus->Run(ShardHost(p.shard), apply_us, [this, &sh] {
          for (int worker : sh.round) {
            sh.lag[sh.version - sh.push_version[static_cast<size_t>(worker)]]++;
            j_.rec[static_cast<size_t>(worker)].version_lag = static_cast<double>(sh.version - sh.push_version[static_cast<size_t>(worker)]);
          }
          sh.round.clear();
          sh.version++;
          sh.cc.OnRoundApplied();
          AnswerHeld(sh);
        });
        return;
      }
      sh.lag[sh.version - version]++;
      j_.rec[static_cast<size_t>(w)].version_lag = static_cast<double>(sh.version - version);
      sh.version++;
      AnswerHeld(sh);
    });
  }

  int64_t TotalFloats() const { return j_.s.params; }

 public:
  Status WriteSummaries(const std::string& dir) {
    for (size_t k = 0; k < shards_.size(); ++k) {
      const Shard& sh = *shards_[k];
      summary::ProcessSummary ps;
      ps.set_role("server");
      ps.set_rank(static_cast<int>(k));
      ps.set_mode(ModeName(j_.plan.mode));
      ps.set_ok(true);
      ps.set_wall_s(j_.engine.now() / 1e6);
      ps.set_pushes(sh.pushes);
      ps.set_pulls(sh.pulls);
      ps.set_bytes_sent(static_cast<int64_t>(sh.sent));
      ps.set_bytes_received(static_cast<int64_t>(sh.received));
      SetHistogram(sh.lag, ps.mutable_version_lag());
      SetHistogram(sh.staleness, ps.mutable_clock_staleness());
      RETURN_IF_ERROR(WriteProcessSummary(dir, ps));
    }
    return OkStatus();
  }

 private:
  Job& j_;
  Codecs& codecs_;
  std::unique_ptr<Partitioner> part_;
  bool compress_ = false, compress_pull_ = false;
  Layout plain_, overlapped_;  // the workers point at these (stable: members, built once)
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<Worker> workers_;
  int finished_ = 0;
};

// ---- All-reduce ----

// Each collective replays the real one's steps (allreduce/plan/schedule.h), with the algorithm
// the real collective would pick (SimulatedAllReduceAlgo): at each step a rank sends its range to
// `to` (the step's header included) and waits for the message of the same step from `from`,
// then sums it in; the shared-memory phases of shm and hier cost CPU on the host's ranks and wait
// for each other, not for the network.
class AllreduceJob {
 public:
  AllreduceJob(Job& job, Codecs& codecs) : j_(job), codecs_(codecs) {}

  Status Build() {
    const auto& t = j_.plan.run.train();
    const int N = j_.plan.workers;
    overlap_ = t.overlap();
    // Buckets in readiness order (the last tensor first): the first of first_bucket_mib, then bucket_mib.
    std::vector<int64_t> rev(j_.s.tensors.rbegin(), j_.s.tensors.rend());
    const double first = t.first_bucket_mib() * 1024 * 1024 / 4, rest = t.bucket_mib() * 1024 * 1024 / 4;
    int64_t filled = 0;
    buckets_.push_back({0, 0});
    for (size_t i = 0; i < rev.size(); ++i) {
      const double cap = buckets_.size() == 1 ? first : rest;
      if (filled > 0 && static_cast<double>(filled + rev[i]) > cap) {
        buckets_.push_back({0, 0});
        filled = 0;
      }
      buckets_.back().floats += rev[i];
      buckets_.back().last_tensor = static_cast<int>(i);  // ready once backward has produced tensor i (reverse order)
      filled += rev[i];
    }
    compress_ = codecs_.on();
    summable_ = compress_ && codecs_.summable();
    for (const auto& b : buckets_) {
      if (compress_) RETURN_IF_ERROR(codecs_.Cost(static_cast<size_t>(b.floats)).status());
    }
    layout_ = SimulatedAllReduceLayout(j_.plan, j_.s);
    ranks_.resize(static_cast<size_t>(N));
    return OkStatus();
  }

  void Start() {
    // Rank 0's parameters to everyone, along the ring, segment by segment (Collective::Broadcast).
    const int N = j_.plan.workers;
    const size_t bytes = 4 * static_cast<size_t>(j_.s.params);
    for (int r = 0; r < N; ++r) {
      Op op;
      op.plan = BroadcastPlan(r, N, 0, bytes);
      op.elem = 1;
      RunOp(r, std::move(op), [this, r] { BeginStep(r); });
    }
  }

 private:
  struct Bucket {
    int64_t floats = 0;
    int last_tensor = 0;
  };
  // One collective on one rank: its steps, their element size, and for an all-gather of
  // per-rank payloads their sizes (the wire bytes of AllGatherPlan's steps).
  struct Op {
    Plan plan;
    size_t elem = 4;
    std::vector<size_t> gather_sizes;  // empty: not an all-gather
  };
  struct Rank {
    int64_t clock = 0;
    Time step_start = 0;
    size_t next_bucket = 0;   // the next bucket the communication thread reduces
    size_t ready = 0;         // buckets backward has produced
    bool busy = false;        // the communication thread is reducing
    bool backward_done = false;
    Time comm_busy_us = 0, hidden_us = 0;
    // The current collective: its steps, the step it is at (-1 while reducing), what runs when
    // it is done, and the messages that arrived early.
    Op op;
    std::function<void()> done;
    int64_t op_seq = -1;         // the collectives this rank has started (every rank runs the same sequence)
    int k = 0;
    bool in_op = false;
    std::map<int64_t, int> arrived;  // Key(op, tag) -> messages
  };
  // A shared-memory phase's messages between the host's ranks (no network), by tag.
  static constexpr uint32_t kShmReduceTag = 0xfff1, kShmBroadcastTag = 0xfff2;

  // What the real collective runs for a bucket: the all-reduce of its floats, the all-reduce of
  // a summable codec's payload (fp16 and bf16 halves, random-k's floats), or the all-gather of
  // every rank's payload.
  Op BucketOp(int r, const Bucket& b) const {
    const int N = j_.plan.workers;
    Op op;
    if (!compress_ || summable_) {
      const CodecCost c = compress_ ? *const_cast<Codecs&>(codecs_).Cost(static_cast<size_t>(b.floats)) : CodecCost{};
      op.elem = summable_ ? const_cast<Codecs&>(codecs_).summed_element_bytes() : 4;
      const size_t count = summable_ ? c.payload / op.elem : static_cast<size_t>(b.floats);
      const AllReduceAlgo algo = ResolveAllReduceAlgo(layout_.setting, count * op.elem, N);
      op.plan = AllReducePlan(algo, r, N, count, layout_.hosts);
      return op;
    }
    const CodecCost c = *const_cast<Codecs&>(codecs_).Cost(static_cast<size_t>(b.floats));
    op.plan = AllGatherPlan(r, N);
    op.elem = 1;
    op.gather_sizes.assign(static_cast<size_t>(N), c.payload);
    return op;
  }

  void RunOp(int r, Op op, std::function<void()> done) {
    auto& rk = ranks_[static_cast<size_t>(r)];
    rk.op = std::move(op);
    rk.done = std::move(done);
    rk.op_seq++;
    rk.k = 0;
    rk.in_op = true;
    RunStep(r);
  }

  const std::vector<int>& HostOf(int r) const {
    for (const auto& h : layout_.hosts)
      if (std::find(h.begin(), h.end(), r) != h.end()) return h;
    return layout_.hosts.front();
  }

  void Post(int from, int to, uint32_t tag, uint64_t bytes) {
    const int64_t key = Key(ranks_[static_cast<size_t>(from)].op_seq, tag);
    if (bytes == 0) {  // through shared memory
      j_.engine.At(j_.engine.now(), [this, to, key] { Arrived(to, key); });
      return;
    }
    j_.rec[static_cast<size_t>(from)].sent += bytes;
    j_.rec[static_cast<size_t>(to)].received += bytes;
    j_.net->Send(from, to, bytes, [this, to, key] { Arrived(to, key); });
  }

  void RunStep(int r) {
    auto& rk = ranks_[static_cast<size_t>(r)];
    if (rk.k >= static_cast<int>(rk.op.plan.size())) {
      rk.in_op = false;
      auto done = std::move(rk.done);
      rk.done = nullptr;
      done();
      return;
    }
    const PlanStep& st = rk.op.plan[static_cast<size_t>(rk.k)];
    if (st.shm != PlanStep::Shm::kNone) return ShmStep(r, st);
    if (st.to >= 0) {
      const uint64_t bytes = rk.op.gather_sizes.empty() ? StepWireBytes(st, rk.op.elem)
                                                         : AllGatherWireBytes(st, j_.plan.workers, rk.op.gather_sizes);
      Post(r, st.to, st.tag, bytes);
    }
    if (st.from < 0) {
      rk.k++;
      RunStep(r);
      return;
    }
    TryAdvance(r);
  }

  // A shared-memory phase among the host's ranks: they meet at the leader (a reduce or an
  // all-reduce needs every member's buffer, a broadcast the leader's result), each spends its
  // copies and sums on its own CPU (apply_ns_per_byte a pass: copy in and sum a share, then copy
  // out), and the region's bytes are counted as the real ShmGroup counts them.
  void ShmStep(int r, const PlanStep& st) {
    auto& rk = ranks_[static_cast<size_t>(r)];
    const auto& host = HostOf(r);
    const int index = static_cast<int>(std::find(host.begin(), host.end(), r) - host.begin());
    const int m = static_cast<int>(host.size()), leader = host.front();
    const ShmBytes moved = SharedMemoryBytes(st.shm, index, m, st.recv.size(), rk.op.elem);
    j_.rec[static_cast<size_t>(r)].shm_sent += moved.sent;
    j_.rec[static_cast<size_t>(r)].shm_received += moved.received;
    const double pass_us = j_.s.apply_ns_per_byte * static_cast<double>(st.recv.size() * rk.op.elem) / 1e3;
    const int k = rk.k;
    rk.k = -1;
    auto hand_back = [this, r, host] {
      for (int x : host)
        if (x != r) Post(r, x, kShmBroadcastTag, 0);
    };
    if (st.shm == PlanStep::Shm::kBroadcast) {
      if (r == leader) {
        hand_back();
        return Resume(r, k, 0, kShmBroadcastTag, 0, nullptr);
      }
      return Resume(r, k, 1, kShmBroadcastTag, pass_us, nullptr);
    }
    const bool all_reduce = st.shm == PlanStep::Shm::kAllReduce;
    j_.cpus->Run(r, 2 * pass_us, [this, r, k, m, leader, all_reduce, pass_us, hand_back] {
      if (r == leader) return Resume(r, k, m - 1, kShmReduceTag, all_reduce ? pass_us : 0,
                                         all_reduce ? std::function<void()>(hand_back) : nullptr);
      Post(r, leader, kShmReduceTag, 0);
      if (all_reduce) return Resume(r, k, 1, kShmBroadcastTag, pass_us, nullptr);
      Resume(r, k, 0, kShmReduceTag, 0, nullptr);  // a member of the hierarchy waits at the broadcast
    });
  }

  // Step k of rank r goes on once `need` messages of `tag` have come: `ready` runs, then `us` of CPU.
  void Resume(int r, int k, int need, uint32_t tag, double us, std::function<void()> ready) {
    waits_[r] = {k, need, tag, us, std::move(ready)};
    ranks_[static_cast<size_t>(r)].k = -2;  // waiting in a shared-memory phase
    TryShm(r);
  }

  void TryShm(int r) {
    auto& rk = ranks_[static_cast<size_t>(r)];
    auto w = waits_.find(r);
    if (rk.k != -2 || w == waits_.end()) return;
    if (w->second.need > 0) {
      auto it = rk.arrived.find(Key(rk.op_seq, w->second.tag));
      if (it == rk.arrived.end() || it->second < w->second.need) return;
      rk.arrived.erase(it);
    }
    ShmWait wait = std::move(w->second);
    waits_.erase(w);
    rk.k = -1;
    if (wait.ready) wait.ready();
    j_.cpus->Run(r, wait.us, [this, r, k = wait.k] {
      ranks_[static_cast<size_t>(r)].k = k + 1;
      RunStep(r);
    });
  }

  static int64_t Key(int64_t op, uint32_t tag) { return op * 1000000 + static_cast<int64_t>(tag); }

  void Arrived(int r, int64_t key) {
    ranks_[static_cast<size_t>(r)].arrived[key]++;
    TryAdvance(r);
    TryShm(r);
  }

  void TryAdvance(int r) {
    auto& rk = ranks_[static_cast<size_t>(r)];
    if (!rk.in_op || rk.k < 0 || rk.k >= static_cast<int>(rk.op.plan.size())) return;
    const PlanStep& st = rk.op.plan[static_cast<size_t>(rk.k)];
    if (st.from < 0 || st.shm != PlanStep::Shm::kNone) return;
    auto it = rk.arrived.find(Key(rk.op_seq, st.tag));
    if (it == rk.arrived.end()) return;
    if (--it->second == 0) rk.arrived.erase(it);
    const int k = rk.k;
    rk.k = -1;  // reducing
    const double reduce_bytes = st.reduce ? static_cast<double>(st.recv.size() * rk.op.elem) : 0;
    j_.cpus->Run(r, j_.s.apply_ns_per_byte * reduce_bytes / 1e3, [this, r, k] {
      auto& q = ranks_[static_cast<size_t>(r)];
      q.k = k + 1;
      RunStep(r);
    });
  }

  void BeginStep(int r) {
    auto& rk = ranks_[static_cast<size_t>(r)];
    rk.step_start = j_.engine.now();
    rk.next_bucket = 0;
    rk.ready = 0;
    rk.backward_done = false;
    rk.comm_busy_us = rk.hidden_us = 0;
    j_.cpus->Run(r, 1e3 * j_.s.compute_ms * j_.s.forward_fraction, [this, r] { BackwardTensor(r, 0); });
  }

  // Backward of tensor i in reverse order (i = 0 is the last tensor).
  void BackwardTensor(int r, int i) {
    const int64_t total = j_.s.params;
    const int64_t size = j_.s.tensors[j_.s.tensors.size() - 1 - static_cast<size_t>(i)];
    const double us = 1e3 * j_.s.compute_ms * (1 - j_.s.forward_fraction) * static_cast<double>(size) / static_cast<double>(total);
    j_.cpus->Run(r, us, [this, r, i] {
      auto& rk = ranks_[static_cast<size_t>(r)];
      while (rk.ready < buckets_.size() && buckets_[rk.ready].last_tensor <= i) rk.ready++;
      const bool last = i + 1 >= static_cast<int>(j_.s.tensors.size());
      if (overlap_ || last) Pump(r);
      if (!last) {
        BackwardTensor(r, i + 1);
        return;
      }
      rk.backward_done = true;
      const double delay = j_.stragglers[static_cast<size_t>(r)].DelayMs(j_.s.compute_ms);
      j_.rec[static_cast<size_t>(r)].delay_ms = delay;
      j_.rec[static_cast<size_t>(r)].compute_ms = j_.s.compute_ms;
      backward_end_[r] = j_.engine.now() + delay * 1e3;
      j_.engine.At(j_.engine.now() + delay * 1e3, [this, r] { MaybeEndStep(r); });
    });
  }

  // The communication thread: the next ready bucket, one at a time.
  void Pump(int r) {
    auto& rk = ranks_[static_cast<size_t>(r)];
    if (rk.busy || rk.next_bucket >= rk.ready) return;
    if (!overlap_ && !rk.backward_done && rk.ready < buckets_.size()) return;
    rk.busy = true;
    const Bucket& b = buckets_[rk.next_bucket];
    const double encode_us = compress_ ? codecs_.Cost(static_cast<size_t>(b.floats))->encode_us : 0;
    op_start_[r] = j_.engine.now();
    // The collective starts once encoded: messages that arrive before wait in `arrived`.
    j_.cpus->Run(r, encode_us, [this, r] {
      auto& q = ranks_[static_cast<size_t>(r)];
      RunOp(r, BucketOp(r, buckets_[q.next_bucket]), [this, r] { BucketDone(r); });
    });
  }

  void BucketDone(int r) {
    auto& rk = ranks_[static_cast<size_t>(r)];
    const Bucket& b = buckets_[rk.next_bucket];
    double us = 0;
    if (compress_ && !summable_) {
      // Every other rank's payload decoded and added.
      const double per = codecs_.Cost(static_cast<size_t>(b.floats))->decode_us + j_.s.apply_ns_per_byte * 4 * static_cast<double>(b.floats) / 1e3;
      us = per * (j_.plan.workers - 1);
    } else if (summable_) {
      us = codecs_.Cost(static_cast<size_t>(b.floats))->decode_us;
    }
    const Time started = op_start_[r];
    j_.cpus->Run(r, us, [this, r, started] {
      auto& q = ranks_[static_cast<size_t>(r)];
      q.comm_busy_us += j_.engine.now() - started;
      if (!q.backward_done) q.hidden_us += j_.engine.now() - started;
      q.op = {};
      q.busy = false;
      q.next_bucket++;
      if (q.next_bucket >= buckets_.size()) {
        MaybeEndStep(r);
        return;
      }
      Pump(r);
    });
  }

  void MaybeEndStep(int r) {
    auto& rk = ranks_[static_cast<size_t>(r)];
    if (!rk.backward_done || rk.next_bucket < buckets_.size() || j_.engine.now() < backward_end_[r]) return;
    if (rk.busy) return;
    // The optimizer, then the row.
    const int64_t total = j_.s.params;
    j_.cpus->Run(r, j_.s.apply_ns_per_byte * 4 * static_cast<double>(total) / 1e3, [this, r] {
      auto& q = ranks_[static_cast<size_t>(r)];
      auto& rec = j_.rec[static_cast<size_t>(r)];
      rec.comm_ms = q.comm_busy_us / 1e3;
      rec.hidden_ms = q.hidden_us / 1e3;
      rec.wait_ms = 0;
      j_.worker_steps++;
      q.clock++;
      (void)j_.Row(r, q.clock);
      if (r == 0 && (j_.EvalDue(q.clock) || q.clock >= j_.s.steps)) (void)j_.EvalRow(q.clock);
      if (q.clock < j_.s.steps) BeginStep(r);
    });
  }

  Job& j_;
  Codecs& codecs_;
  bool overlap_ = true, compress_ = false, summable_ = false;
  std::vector<Bucket> buckets_;
  std::vector<Rank> ranks_;
  std::map<int, Time> op_start_, backward_end_;
  SimAllReduceLayout layout_;
  struct ShmWait {
    int k = 0, need = 0;
    uint32_t tag = 0;
    double us = 0;
    std::function<void()> ready;
  };
  std::map<int, ShmWait> waits_;  // ranks in a shared-memory phase, waiting for the others
};

Result<double> RateBits(const std::string& rate, const std::string& what) {
  auto bits = TcRateBitsPerSecond(rate);
  if (!bits.ok()) return InvalidArgumentError(what + ": " + bits.status().message());
  return *bits;
}

}  // namespace

Result<SimSettings> ResolveSim(const RunPlan& plan) {
  const spec::Sim& sim = plan.run.sim();
  const config::TrainConfig& t = plan.run.train();
  SimSettings s;
  if (sim.has_compute_ms()) {
    if (!(sim.compute_ms() >= 0)) return InvalidArgumentError("sim.compute_ms must be >= 0");
    s.compute_ms = sim.compute_ms();
    s.compute_source = "given";
  } else if (sim.has_compute_from()) {
    ASSIGN_OR_RETURN(s.compute_ms, MedianComputeMs(sim.compute_from()));
    s.compute_source = sim.compute_from();
  } else {
    return InvalidArgumentError(
        "the simulation needs the compute time per step: --compute-ms=MS, or in the spec sim { compute_ms: MS } or "
        "sim { compute_from: \"<a real run's metrics.csv>\" }");
  }
  if (sim.has_forward_fraction()) {
    if (!(sim.forward_fraction() > 0 && sim.forward_fraction() < 1)) return InvalidArgumentError("sim.forward_fraction must be in (0, 1)");
    s.forward_fraction = sim.forward_fraction();
  }
  // What a host moves over its own veth or loopback, unshaped.
  ASSIGN_OR_RETURN(s.peak_bits_per_s, RateBits(sim.has_loopback_rate() ? sim.loopback_rate() : "20gbit", "sim.loopback_rate"));
  if (sim.has_link_rate()) {
    s.link = sim.link_rate();
    ASSIGN_OR_RETURN(s.link_bits_per_s, RateBits(s.link, "sim.link_rate"));
  } else if (plan.run.has_link() && !plan.run.link().rate().empty()) {
    // An emulated link is tc tbf with netns.h's bucket: what the bucket holds passes at the
    // host's own speed.
    s.link = plan.run.link().rate();
    ASSIGN_OR_RETURN(s.link_bits_per_s, RateBits(s.link, "link.rate"));
    s.burst_bytes = TbfBurstBytes(s.link_bits_per_s);
  } else {
    s.link = plan.run.has_link() ? "unshaped" : "loopback";
    s.link_bits_per_s = s.peak_bits_per_s;
  }
  if (!sim.has_link_rate() && plan.run.has_link()) s.latency_us += 1e3 * plan.run.link().delay_ms();
  if (sim.has_latency_us()) {
    if (!(sim.latency_us() >= 0)) return InvalidArgumentError("sim.latency_us must be >= 0");
    s.latency_us = sim.latency_us() + (plan.run.has_link() && !sim.has_link_rate() ? 1e3 * plan.run.link().delay_ms() : 0);
  }
  if (sim.rack_size() < 0) return InvalidArgumentError("sim.rack_size must be >= 0");
  s.rack_size = sim.rack_size();
  if (sim.has_oversubscription()) {
    if (!(sim.oversubscription() >= 1)) return InvalidArgumentError("sim.oversubscription must be >= 1");
    s.oversubscription = sim.oversubscription();
  }
  if (sim.host_cores() < 0) return InvalidArgumentError("sim.host_cores must be >= 0");
  s.host_cores = sim.host_cores();
  if (sim.has_usable_cores()) {
    if (!(sim.usable_cores() > 0 && sim.usable_cores() <= s.host_cores))
      return InvalidArgumentError("sim.usable_cores must be > 0 and at most host_cores");
    s.usable_cores = sim.usable_cores();
  }
  if (!(sim.net_ns_per_byte() >= 0)) return InvalidArgumentError("sim.net_ns_per_byte must be >= 0");
  s.net_ns_per_byte = sim.net_ns_per_byte();
  if (!(sim.msg_us() >= 0)) return InvalidArgumentError("sim.msg_us must be >= 0");
  s.msg_us = sim.msg_us();
  if (sim.has_apply_ns_per_byte()) {
    if (!(sim.apply_ns_per_byte() >= 0)) return InvalidArgumentError("sim.apply_ns_per_byte must be >= 0");
    s.apply_ns_per_byte = sim.apply_ns_per_byte();
  }
  // A sender's connections take turns on its link, finely (TCP flows sharing a link).
  if (sim.has_nic_quantum_kb()) {
    if (!(sim.nic_quantum_kb() >= 1.5)) return InvalidArgumentError("sim.nic_quantum_kb must be >= 1.5");
    s.quantum_bytes = sim.nic_quantum_kb() * 1024;
  }
  if (!(sim.flow_share_spread() >= 0 && sim.flow_share_spread() < 1)) return InvalidArgumentError("sim.flow_share_spread must be in [0, 1)");
  s.flow_share_spread = sim.flow_share_spread();
  if (sim.has_share_draws()) {
    if (sim.share_draws() < 1 || sim.share_draws() > 99) return InvalidArgumentError("sim.share_draws must be 1 to 99");
    s.share_draws = sim.share_draws();
  }
  if (sim.has_wire_efficiency()) {
    if (!(sim.wire_efficiency() > 0 && sim.wire_efficiency() <= 1)) return InvalidArgumentError("sim.wire_efficiency must be in (0, 1]");
    s.wire_efficiency = sim.wire_efficiency();
  }
  if (sim.tensors_size() > 0) {
    for (int64_t n : sim.tensors()) {
      if (n <= 0) return InvalidArgumentError("sim.tensors: every tensor needs > 0 floats");
      s.tensors.push_back(n);
    }
  } else {
    ASSIGN_OR_RETURN(s.tensors, ModelTensors(t));
  }
  for (int64_t n : s.tensors) s.params += n;
  const int64_t examples = sim.has_train_examples() ? sim.train_examples() : 60000;
  if (examples <= 0) return InvalidArgumentError("sim.train_examples must be > 0");
  const int64_t batch = t.batch() * std::max<int64_t>(1, t.accumulate());
  s.steps_per_epoch = std::max<int64_t>(1, (examples / plan.workers + batch - 1) / batch);
  s.steps = sim.has_steps() ? sim.steps() : s.steps_per_epoch * t.epochs();
  if (!sim.has_steps() && t.max_steps() > 0) s.steps = std::min(s.steps, t.max_steps());
  if (s.steps <= 0) return InvalidArgumentError("sim.steps must be > 0");
  s.hier_group = sim.has_hier_group() ? sim.hier_group() : s.rack_size > 0 ? s.rack_size : 8;
  if (s.hier_group < 1) return InvalidArgumentError("sim.hier_group must be >= 1");
  const auto algo = AllReduceAlgoNamed(t.allreduce_algo());
  if (!algo) return InvalidArgumentError("allreduce_algo '" + t.allreduce_algo() + "' is not an all-reduce algorithm");
  s.algorithm = *algo;
  s.allreduce_shm = t.allreduce_shm() && !t.ring_encrypt();
  if (plan.mode == config::ALLREDUCE && plan.workers > 1) {
    // What the real collective refuses, so does the simulation (RingCollective::AllReduceWith).
    const auto layout = SimulatedAllReduceLayout(plan, s);
    if ((s.algorithm == AllReduceAlgo::kShm || s.algorithm == AllReduceAlgo::kHier) && !layout.setting.shared_memory) {
      return InvalidArgumentError(std::string("allreduce_algo '") + AllReduceAlgoName(s.algorithm) +
                                  "' needs shared memory between a host's ranks: allreduce_shm on, no ring_encrypt" +
                                  (s.algorithm == AllReduceAlgo::kShm ? ", and every rank on one host (a run without link)" : ""));
    }
    if (s.algorithm == AllReduceAlgo::kShm && layout.hosts.size() != 1) {
      return InvalidArgumentError("allreduce_algo 'shm' needs every rank on one host (a run without link)");
    }
  }
  if (sim.has_codec_from()) RETURN_IF_ERROR(CodecTimesFromTrace(sim.codec_from(), &s));
  if (sim.has_accuracy_from()) {
    ASSIGN_OR_RETURN(s.accuracy, AccuracyCurve(sim.accuracy_from()));
    s.accuracy_source = sim.accuracy_from();
  }
  if (t.precision() != "fp32") return InvalidArgumentError("precision '" + t.precision() + "': the simulation has fp32 only");
  return s;
}

SimAllReduceLayout SimulatedAllReduceLayout(const RunPlan& plan, const SimSettings& s) {
  SimAllReduceLayout l;
  const int n = std::max(1, plan.workers);
  const bool loopback = !plan.run.has_link() && plan.run.sim().link_rate().empty();
  const int per_host = loopback ? n : s.algorithm == AllReduceAlgo::kHier ? std::max(1, s.hier_group) : 1;
  for (int r = 0; r < n; ++r) {
    if (r % per_host == 0) l.hosts.emplace_back();
    l.hosts.back().push_back(r);
  }
  l.setting.requested = s.algorithm;
  l.setting.hosts = static_cast<int>(l.hosts.size());
  l.setting.shared_memory = s.allreduce_shm && per_host > 1;
  // Rank 0's host (the first is the largest); a core per process unless host_cores are shared.
  l.setting.oversubscribed = s.host_cores > 0 && Oversubscribed(l.hosts.front().size(), static_cast<unsigned>(s.host_cores));
  return l;
}

AllReduceAlgo SimulatedAllReduceAlgo(const RunPlan& plan, const SimSettings& s, size_t bytes) {
  return ResolveAllReduceAlgo(SimulatedAllReduceLayout(plan, s).setting, bytes, std::max(1, plan.workers));
}

std::string DescribeSim(const RunPlan& plan, const SimSettings& s) {
  std::ostringstream o;
  o.precision(4);
  o << "compute " << s.compute_ms << " ms/step (" << s.compute_source << "), links " << s.link << ", latency " << s.latency_us << " us";
  if (s.rack_size > 0) o << ", racks of " << s.rack_size << " (uplink oversubscribed " << s.oversubscription << ":1)";
  if (s.host_cores > 0) {
    o << ", all processes on " << s.host_cores << " cores (";
    if (s.usable_cores > 0) o << s.usable_cores << " of them usable, ";
    o << s.net_ns_per_byte << " ns of CPU per byte moved";
    if (s.msg_us > 0) o << ", " << s.msg_us << " us per PS message, shared by those that wait for the same wake-up";
    o << ")";
  }
  if (plan.mode == config::ALLREDUCE) {
    const auto layout = SimulatedAllReduceLayout(plan, s);
    o << ", all-reduce " << AllReduceAlgoName(s.algorithm) << " on " << layout.hosts.size() << " host"
      << (layout.hosts.size() == 1 ? "" : "s") << (layout.setting.shared_memory ? " (shared memory)" : "")
      << (layout.setting.oversubscribed ? " (oversubscribed)" : "");
  }
  if (s.flow_share_spread > 0) {
    o << ", a connection's share of its sender's link x (1 ± " << s.flow_share_spread << "), drawn per connection";
    if (s.share_draws > 1) o << " (" << s.share_draws << " draws, the median by step time reported)";
  }
  if (plan.run.has_link() && !plan.run.link().congestion_control().empty())
    o << ", TCP's congestion control (" << plan.run.link().congestion_control() << ") not modelled"
      << (s.flow_share_spread > 0 ? "" : ": flows share a link evenly");
  o << ", " << s.steps << " steps";
  if (!s.codec_source.empty()) o << ", codec encode times from " << s.codec_source;
  if (!s.accuracy_source.empty()) o << ", accuracy vs step from " << s.accuracy_source;
  return o.str();
}

namespace {

// One simulation of the run with this draw of the shares; `step_ms` gets its step time as the
// report counts it (the median over the workers of report.h's StepMs), NaN without one.
Result<SimStats> SimulateDraw(const RunPlan& plan, const SimSettings& s, const std::string& run_dir, uint64_t share_seed,
                              const std::string& note, double* step_ms) {
  const auto started = std::chrono::steady_clock::now();
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) return UnavailableError(run_dir + ": cannot create: " + ec.message());
  const bool ps = plan.mode != config::ALLREDUCE;
  if (ps && plan.servers < 1) return InvalidArgumentError("a PS run needs servers");
  const int hosts = (ps ? plan.servers : 0) + plan.workers;
  Job job(plan, s, hosts, share_seed);
  for (int w = 0; w < plan.workers; ++w) {
    ASSIGN_OR_RETURN(MetricsWriter m, MetricsWriter::Open(run_dir + "/worker-" + std::to_string(w) + ".csv", plan.name, w));
    job.rec[static_cast<size_t>(w)].metrics = std::make_unique<MetricsWriter>(std::move(m));
  }
  const auto& t = plan.run.train();
  Codecs codecs(t.compress(), t.error_feedback(), t.momentum_correction() ? t.momentum() : 0.0f, s.encode_us_per_float,
                s.pull_encode_us_per_float);
  std::unique_ptr<PsJob> ps_job;
  std::unique_ptr<AllreduceJob> ar_job;
  if (ps) {
    ps_job = std::make_unique<PsJob>(job, codecs);
    RETURN_IF_ERROR(ps_job->Build());
    ps_job->Start();
  } else {
    ar_job = std::make_unique<AllreduceJob>(job, codecs);
    RETURN_IF_ERROR(ar_job->Build());
    ar_job->Start();
  }
  job.engine.Run();
  for (auto& r : job.rec) RETURN_IF_ERROR(r.metrics->Flush());
  if (ps_job) RETURN_IF_ERROR(ps_job->WriteSummaries(run_dir));
  for (int w = 0; w < plan.workers; ++w) {
    summary::ProcessSummary ws;
    ws.set_role("worker");
    ws.set_rank(w);
    ws.set_mode(ModeName(plan.mode));
    ws.set_ok(true);
    ws.set_wall_s(job.engine.now() / 1e6);
    ws.set_params(s.params);
    ws.set_steps(s.steps);
    ws.set_bytes_sent(static_cast<int64_t>(job.rec[static_cast<size_t>(w)].sent));
    ws.set_bytes_received(static_cast<int64_t>(job.rec[static_cast<size_t>(w)].received));
    RETURN_IF_ERROR(WriteProcessSummary(run_dir, ws));
  }
  std::ofstream(run_dir + "/commands.txt") << "# simulated by gradsync-sim: " << DescribeSim(plan, s) << note << "\n";
  SimStats st;
  st.codecs = codecs.Describe();
  st.events = job.engine.events();
  st.worker_steps = job.worker_steps;
  st.simulated_worker_steps = job.worker_steps;
  st.simulated_s = job.engine.now() / 1e6;
  for (int h = 0; h < hosts; ++h) (h < hosts - plan.workers ? st.server_cpu_s : st.worker_cpu_s) += job.cpus->busy_us(h) / 1e6;
  st.kernel_cpu_s = job.cpus->kernel_us() / 1e6;
  st.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::vector<double> per_worker;
  for (const auto& r : job.rec) {
    if (const double ms = StepMs(r.rows); !std::isnan(ms)) per_worker.push_back(ms);
  }
  *step_ms = per_worker.empty() ? NAN : Median(std::move(per_worker));
  return st;
}

}  // namespace

Result<SimStats> SimulateRun(const RunPlan& plan, const SimSettings& s, const std::string& run_dir) {
  const uint64_t seed = plan.run.train().seed();
  double step_ms = NAN;
  const int draws = s.flow_share_spread > 0 ? s.share_draws : 1;
  if (draws == 1) return SimulateDraw(plan, s, run_dir, seed, "", &step_ms);
  // Draw d's shares: train.seed's for the first, as a single draw has them.
  auto seed_of = [seed](int d) { return d == 0 ? seed : Rng::Derive(seed, kShareStream, static_cast<uint64_t>(d)); };
  std::vector<double> ms(static_cast<size_t>(draws));
  double elapsed = 0;
  int64_t worker_steps = 0;
  for (int d = 0; d < draws; ++d) {
    ASSIGN_OR_RETURN(SimStats st, SimulateDraw(plan, s, run_dir, seed_of(d), "", &ms[static_cast<size_t>(d)]));
    elapsed += st.elapsed_s;
    worker_steps += st.simulated_worker_steps;
  }
  // The median draw (the lower of the middle two for an even count; a draw without a step time
  // sorts last) is simulated again to write its files.
  std::vector<int> order(static_cast<size_t>(draws));
  for (int d = 0; d < draws; ++d) order[static_cast<size_t>(d)] = d;
  auto key = [&ms](int d) { return std::isnan(ms[static_cast<size_t>(d)]) ? INFINITY : ms[static_cast<size_t>(d)]; };
  std::stable_sort(order.begin(), order.end(), [&key](int a, int b) { return key(a) < key(b); });
  const int median = order[static_cast<size_t>((draws - 1) / 2)];
  std::ostringstream described;
  described << "shares drawn " << draws << " times, step ms";
  for (int d = 0; d < draws; ++d) described << (d ? ", " : " ") << (std::isnan(ms[static_cast<size_t>(d)]) ? std::string("-") : Fixed(ms[static_cast<size_t>(d)], 2));
  described << "; draw " << median + 1 << " (the median) reported";
  ASSIGN_OR_RETURN(SimStats st, SimulateDraw(plan, s, run_dir, seed_of(median), "; " + described.str(), &step_ms));
  st.draws = described.str();
  st.draw_step_ms = ms;
  st.reported_draw = median;
  st.elapsed_s += elapsed;
  st.simulated_worker_steps += worker_steps;
  return st;
}

}  // namespace gradsync
