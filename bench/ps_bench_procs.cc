// gradsync-bench-ps --processes (see ps_bench_procs.h).
//
// Per configuration: gradsync-server --role=scheduler (--port-file), S gradsync-server
// --role=server --mode=asp shards and W workers, each worker this binary re-executed as
// --role=worker. A worker registers through SchedulerClient, worker 0 initialises the tensor,
// and each runs the in-process mode's loops (2 warm-up operations, then `repeats` repeats of
// `iters` operations, all workers starting every repeat together through a scheduler barrier).
// It prints its per-repeat start and end (steady_clock, which is CLOCK_MONOTONIC: one clock for
// every process of the machine) and its latencies on stdout; the parent takes a repeat's wall
// time as the last end minus the first start, so throughput per repeat = all workers' value
// bytes / that time, the median over repeats, latency p50/p99 over every operation.
//
// Ceilings, per message size (a shard's part of the tensor, ceil(floats / servers) * 4 bytes),
// each a receiver process and a sender process over 127.0.0.1 TCP: ZeroMQ PUSH/PULL (the sender
// streams `iters` messages, the receiver acknowledges the last), ZeroMQ REQ/REP (push: the big
// message as the request and a 16-byte reply; pull: a 16-byte request and the big reply;
// push+pull: big both ways), zero-copy sends throughout; one TCP stream of the same bytes
// (POSIX sockets, TCP_NODELAY, acknowledged at the end of each repeat); memcpy in the parent.
// Each is timed over the same iters and repeats as the PS rows; the median is reported.
//
// Small requests (--small-keys=K), per configuration: a job whose one tensor is sparse
// (kSmallRows floats, addressed by key); each worker pushes K sorted unique random keys with
// their values and waits for the replies, then (second row) pulls K keys the same way; round
// trips/s = all workers' operations / the repeat's wall time (one operation is one request to
// every shard and every reply). The workers measure the bytes of a request and a reply per shard
// (PsClient's traffic counters: header, keys and values frames); the ceiling is ZeroMQ REQ/REP
// with exactly those frames, in the configuration's topology, timed the same way. The two are
// interleaved: the parent starts every repeat of the workers and of the ceiling's senders through
// their stdin, one after the other, so that the machine's noisy spells hit both alike.
#include "bench/ps_bench_procs.h"

#include "bench/ps_bench_jobs.h"
#include "bench/ps_bench_rows.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/base/logging.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/net/transport.h"
#include "worker/ps/client/ps_client.h"

namespace gradsync::psbench {
namespace {

// ---------------------------------------------------------------------------------------------
// Roles (children).

const char* kOps[] = {"push", "pull", "push+pull"};

int RunWorker(const std::map<std::string, std::string>& a) {
  const int workers = static_cast<int>(Int(a, "workers"));
  const int64_t size = Int(a, "size");
  const int iters = static_cast<int>(Int(a, "iters")), repeats = static_cast<int>(Int(a, "repeats"));
  auto job = JoinBenchJob(a, {{"w", {size}, 0, size, false}}, BenchJobConfig(size, workers));
  SchedulerClient& client = *job->client;
  PsClient* ps = job->ps.get();
  std::vector<float> params(static_cast<size_t>(size), 0.0f), grads(static_cast<size_t>(size), 0.0f);
  const std::string path = a.count("path") ? a.at("path") : "zmq";
  const int servers = static_cast<int>(Int(a, "servers"));
  if (path == "shm") {
    AttachEveryLane(*ps, servers);
  } else if (path == "tcp") {
    auto channels = ps->AttachDataChannels(60);
    if (!channels.ok()) Die("data channel: " + channels.status().message());
    if (*channels != servers) {
      Die("data channel: " + std::to_string(*channels) + " of " + std::to_string(servers) + " shards took one");
    }
  }
  int64_t clock = 0;
  std::ostringstream out;
  for (int k = 0; k < 3; ++k) {
    auto one = [&] {
      auto t0 = Clock::now();
      if (k != 1) {
        auto id = ps->Push(clock, grads, {}, {});
        if (!id.ok()) Die("push: " + id.status().message());
        if (Status s = ps->Wait(*id, 60); !s.ok()) Die("push: " + s.message());
        ++clock;
      }
      if (k != 0) {
        auto id = ps->Pull(clock, params, {});
        if (!id.ok()) Die("pull: " + id.status().message());
        if (Status s = ps->Wait(*id, 60); !s.ok()) Die("pull: " + s.message());
      }
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    for (int i = 0; i < 2; ++i) one();  // warm-up
    std::vector<double> lat;
    for (int r = 0; r < repeats; ++r) {
      const std::string name = "r" + std::to_string(k) + "_" + std::to_string(r);
      if (Status s = client.Barrier(name, "workers", 60); !s.ok()) Die("worker barrier: " + s.message());
      const int64_t t0 = NowNs();
      for (int i = 0; i < iters; ++i) lat.push_back(one());
      out << "R " << k << " " << r << " " << t0 << " " << NowNs() << "\n";
    }
    out << "L " << k;
    for (double l : lat) out << " " << l;
    out << "\n";
  }
  int64_t wrong = 0;
  for (float v : params) wrong += v != 0.0f;  // zero gradients, lr 1: every value stays 0
  out << "W " << wrong << "\n";
  return Leave(client, out.str());
}

// Small requests: the sparse tensor's rows, and how many key sets each worker cycles through
// (drawn before the timed loops, so no drawing is timed; every set is used in the warm-up).
constexpr int64_t kSmallRows = int64_t{1} << 20;
constexpr int kKeySets = 64;
const char* kSmallOps[] = {"sparse-push", "sparse-pull"};

wire::JobConfig SparseJobConfig(int workers) {
  wire::JobConfig config = BenchJobConfig(kSmallRows, workers);
  config.mutable_tensors(0)->set_name("emb");
  config.mutable_tensors(0)->set_sparse(true);
  return config;
}

// --role=worker --keys=K: sparse pushes, then sparse pulls, of K keys per operation. After the
// warm-up it prints "READY"; then each repeat starts when the parent writes "go" on stdin and
// ends with "R op repeat t0 t1 request_bytes reply_bytes" (bytes per message to / from one shard,
// over that repeat); at the end "L op latencies..." per op and "W wrong".
int RunSmallWorker(const std::map<std::string, std::string>& a) {
  const int w = static_cast<int>(Int(a, "rank")), workers = static_cast<int>(Int(a, "workers"));
  const size_t keys_per_op = static_cast<size_t>(Int(a, "keys"));
  const int iters = static_cast<int>(Int(a, "iters")), repeats = static_cast<int>(Int(a, "repeats"));
  auto job = JoinBenchJob(a, {{"emb", {kSmallRows}, 0, kSmallRows, true}}, SparseJobConfig(workers));
  SchedulerClient& client = *job->client;
  PsClient* ps = job->ps.get();
  std::vector<float> params(static_cast<size_t>(kSmallRows), 0.0f);
  std::mt19937_64 rng(0x5eed + static_cast<uint64_t>(w));
  std::uniform_int_distribution<uint64_t> row(0, static_cast<uint64_t>(kSmallRows) - 1);
  std::vector<std::vector<uint64_t>> sets(kKeySets);
  for (auto& keys : sets) {
    std::set<uint64_t> pick;
    while (pick.size() < keys_per_op) pick.insert(row(rng));
    keys.assign(pick.begin(), pick.end());  // sorted and unique
  }
  const std::vector<float> grads(keys_per_op, 0.0f);  // zero gradients: every parameter stays 0
  std::fill(params.begin(), params.end(), 1.0f);     // so every pulled key must come back 0
  int64_t clock = 0;
  auto one = [&](int k, size_t i) {
    const std::vector<uint64_t>& keys = sets[i % kKeySets];
    auto t0 = Clock::now();
    auto id = k == 0 ? ps->Push(clock, params, keys, grads) : ps->Pull(clock, params, keys);
    if (!id.ok()) Die(std::string(kSmallOps[k]) + ": " + id.status().message());
    if (Status s = ps->Wait(*id, 60); !s.ok()) Die(std::string(kSmallOps[k]) + ": " + s.message());
    if (k == 0) ++clock;
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  };
  for (int k = 0; k < 2; ++k) {
    for (size_t i = 0; i < kKeySets; ++i) one(k, i);  // warm-up: every key set
  }
  std::printf("READY\n");
  std::fflush(stdout);
  std::ostringstream out;
  for (int k = 0; k < 2; ++k) {
    std::vector<double> lat;
    size_t next = 0;
    for (int r = 0; r < repeats; ++r) {
      // The parent says when (it times the ceiling between two repeats); all workers start together.
      char line[64];
      if (!std::fgets(line, sizeof line, stdin) || std::string(line) != "go\n") Die("worker: no 'go' from the parent");
      const std::string name = "s" + std::to_string(k) + "_" + std::to_string(r);
      if (Status s = client.Barrier(name, "workers", 60); !s.ok()) Die("worker barrier: " + s.message());
      const TrafficCounters before = ps->traffic();
      const int64_t t0 = NowNs();
      for (int i = 0; i < iters; ++i) lat.push_back(one(k, next++));
      const int64_t t1 = NowNs();
      const TrafficCounters after = ps->traffic();
      // Bytes of one request to one shard and of one reply, every frame (header, keys, values).
      const double sent = static_cast<double>(after.bytes_sent - before.bytes_sent) /
                          static_cast<double>(std::max<uint64_t>(1, after.messages_sent - before.messages_sent));
      const double received = static_cast<double>(after.bytes_received - before.bytes_received) /
                              static_cast<double>(std::max<uint64_t>(1, after.messages_received - before.messages_received));
      std::printf("R %d %d %lld %lld %.3f %.3f\n", k, r, static_cast<long long>(t0), static_cast<long long>(t1), sent, received);
      std::fflush(stdout);
    }
    out << "L " << k;
    for (double l : lat) out << " " << l;
    out << "\n";
  }
  int64_t wrong = 0;
  for (const auto& keys : sets) {
    for (uint64_t key : keys) wrong += params[key] != 0.0f;
  }
  out << "W " << wrong << "\n";
  return Leave(client, out.str());
}

// Zero-copy: ZeroMQ sends straight from `data`, which never changes (no free function).
void SendZeroCopy(zmq::socket_t& s, const std::vector<char>& data) {
  zmq::message_t m(const_cast<char*>(data.data()), data.size(), nullptr, nullptr);
  s.send(m, zmq::send_flags::none);
}

void RecvOne(zmq::socket_t& s) {
  zmq::message_t m;
  if (!s.recv(m)) Die("zmq recv");
}

// A multipart message: every frame of it.
void RecvAll(zmq::socket_t& s) {
  zmq::message_t m;
  do {
    if (!s.recv(m)) Die("zmq recv");
  } while (m.more());
}

// Frames of the given sizes, as one multipart message (zero-copy from `frames`).
void SendFrames(zmq::socket_t& s, const std::vector<std::vector<char>>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    zmq::message_t m(const_cast<char*>(frames[i].data()), frames[i].size(), nullptr, nullptr);
    s.send(m, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

// "a,b,c" -> frames of a, b and c bytes.
std::vector<std::vector<char>> FramesOf(const std::string& sizes) {
  std::vector<std::vector<char>> frames;
  std::stringstream ss(sizes);
  std::string item;
  while (std::getline(ss, item, ',')) frames.emplace_back(static_cast<size_t>(std::stoll(item)), 1);
  if (frames.empty()) Die("no frame sizes in '" + sizes + "'");
  return frames;
}

uint16_t PortOf(zmq::socket_t& s) {
  const std::string ep = s.get(zmq::sockopt::last_endpoint);
  return static_cast<uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1)));
}

void ReadFull(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) Die("tcp read");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

void WriteFull(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::write(fd, p, n);
    if (r <= 0) Die("tcp write");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

// kind: stream (ZeroMQ PUSH/PULL; --bytes), reqrep (ZeroMQ REQ/REP; --req and --rep: the frame
// sizes of a request and a reply), tcp (--bytes). The receiver prints "PORTS a b" first; the
// sender prints "R secs" per repeat (reqrep: "T repeat t0 t1").
int RunCeiling(const std::map<std::string, std::string>& a, bool rx) {
  const std::string kind = Str(a, "kind");
  const size_t bytes = kind == "reqrep" ? 0 : static_cast<size_t>(Int(a, "bytes"));
  const int iters = static_cast<int>(Int(a, "iters")), rounds = static_cast<int>(Int(a, "repeats")) + 1;  // + warm-up
  std::vector<char> big(bytes, 1), small(16, 1);
  if (kind == "tcp") {
    if (rx) {
      int l = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t len = sizeof(addr);
      if (::bind(l, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(l, 1) != 0) Die("tcp bind");
      ::getsockname(l, reinterpret_cast<sockaddr*>(&addr), &len);
      std::printf("PORTS %u 0\n", ntohs(addr.sin_port));
      std::fflush(stdout);
      int c = ::accept(l, nullptr, nullptr);
      if (c < 0) Die("tcp accept");
      for (int r = 0; r < rounds; ++r) {
        for (int i = 0; i < iters; ++i) ReadFull(c, big.data(), bytes);
        WriteFull(c, small.data(), 1);
      }
      ::close(c);
      ::close(l);
      return 0;
    }
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(Int(a, "port")));
    if (::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("tcp connect");
    int one = 1;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    for (int r = 0; r < rounds; ++r) {
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) WriteFull(c, big.data(), bytes);
      ReadFull(c, small.data(), 1);
      if (r > 0) std::printf("R %.9f\n", std::chrono::duration<double>(Clock::now() - t0).count());
    }
    ::close(c);
    std::fflush(stdout);
    return 0;
  }
  TransportContext ctx(1);
  if (kind == "stream") {
    if (rx) {
      zmq::socket_t in(ctx, zmq::socket_type::pull), ack(ctx, zmq::socket_type::push);
      in.bind("tcp://127.0.0.1:*");
      ack.bind("tcp://127.0.0.1:*");
      std::printf("PORTS %u %u\n", PortOf(in), PortOf(ack));
      std::fflush(stdout);
      for (int r = 0; r < rounds; ++r) {
        for (int i = 0; i < iters; ++i) RecvOne(in);
        SendZeroCopy(ack, small);
      }
      return 0;
    }
    zmq::socket_t out(ctx, zmq::socket_type::push), ack(ctx, zmq::socket_type::pull);
    out.connect("tcp://127.0.0.1:" + Str(a, "port"));
    ack.connect("tcp://127.0.0.1:" + Str(a, "port2"));
    for (int r = 0; r < rounds; ++r) {
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) SendZeroCopy(out, big);
      RecvOne(ack);
      if (r > 0) std::printf("R %.9f\n", std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::fflush(stdout);
    return 0;
  }
  if (kind != "reqrep") Die("unknown ceiling kind " + kind);
  // A REP receiver (a shard) answers --clients senders; a sender (a worker) holds one REQ per
  // receiver (--ports=a,b,...) and, per operation, sends on every one and then reads every reply,
  // as PsClient does with its shards. --stdin=1: rounds on the parent's word instead of back to
  // back, each with its own frames: a receiver reads "go REPLY_FRAMES REQUESTS" (it answers that
  // many), a sender "go REQUEST_FRAMES" (it runs --iters operations and prints "T round t0 t1");
  // "end" ends both.
  const bool paced = a.count("stdin") > 0;
  auto next_round = [&](std::vector<std::vector<char>>* frames, int64_t* count) {
    char line[512];
    if (!std::fgets(line, sizeof line, stdin)) Die("ceiling: the parent went away");
    std::istringstream in(line);
    std::string word, sizes;
    in >> word;
    if (word == "end") return false;
    if (word != "go" || !(in >> sizes)) Die(std::string("ceiling: bad line from the parent: ") + line);
    *frames = FramesOf(sizes);
    if (count && !(in >> *count)) Die(std::string("ceiling: bad line from the parent: ") + line);
    return true;
  };
  std::vector<std::vector<char>> request, reply;
  if (!paced) {
    request = FramesOf(Str(a, "req"));
    reply = FramesOf(Str(a, "rep"));
  }
  if (rx) {
    zmq::socket_t rep(ctx, zmq::socket_type::rep);
    rep.bind("tcp://127.0.0.1:*");
    std::printf("PORTS %u 0\n", PortOf(rep));
    std::fflush(stdout);
    int64_t total = static_cast<int64_t>(rounds) * iters * Int(a, "clients");
    while (!paced || next_round(&reply, &total)) {
      for (int64_t i = 0; i < total; ++i) {
        RecvAll(rep);
        SendFrames(rep, reply);
      }
      if (!paced) break;
    }
    return 0;
  }
  std::vector<zmq::socket_t> reqs;
  std::stringstream ports(Str(a, "ports"));
  std::string port;
  while (std::getline(ports, port, ',')) {
    reqs.emplace_back(ctx, zmq::socket_type::req);
    reqs.back().connect("tcp://127.0.0.1:" + port);
  }
  std::ostringstream out;
  for (int r = 0; paced || r < rounds; ++r) {
    if (paced && !next_round(&request, nullptr)) break;
    const int64_t t0 = NowNs();
    for (int i = 0; i < iters; ++i) {
      for (auto& q : reqs) SendFrames(q, request);
      for (auto& q : reqs) RecvAll(q);
    }
    const int64_t t1 = NowNs();
    if (paced) {
      std::printf("T %d %lld %lld\n", r, static_cast<long long>(t0), static_cast<long long>(t1));
      std::fflush(stdout);
    } else if (r > 0) {
      out << "T " << r - 1 << " " << t0 << " " << t1 << "\n";
    }
  }
  std::fputs(out.str().c_str(), stdout);
  std::fflush(stdout);
  return 0;
}

struct PsRow {
  std::string path;  // zmq | tcp | shm
  std::string op;
  int servers, workers;
  int64_t size;
  double gbps, p50_ms, p99_ms;
  int64_t wrong;
  int64_t msg_bytes;
  double ceiling = 0;
  double vs_tcp = 0;  // gbps / the tcp row's of the same op and configuration (0: none)
  double vs_zmq = 0;  // the same against the zmq row
};

struct CeilRow {
  std::string name;
  int servers, workers;  // receivers and senders (0: memcpy)
  int64_t bytes;
  int iters;
  double gbps;
};

// A small-request row: round trips/s and latency, the bytes of a request and a reply per shard
// (as the workers' traffic counters saw them), and the REQ/REP ceiling of those bytes.
struct SmallRow {
  std::string op;  // sparse-push | sparse-pull
  int servers = 0, workers = 0, keys = 0, iters = 0;
  double rtps = 0, p50_us = 0, p99_us = 0;  // median over repeats; latency over every op
  int64_t wrong = 0;
  double request_bytes = 0, reply_bytes = 0;  // measured, mean over repeats
  double ceiling = 0;                         // REQ/REP rt/s, median over repeats
  double ceiling_request_bytes = 0, ceiling_reply_bytes = 0;
  double paired = 0;  // median over repeats of rt/s over the ceiling's rt/s of the same repeat
};

// One configuration as processes. False when a child failed or a deadline passed.
bool RunConfigProcs(const std::string& path, int servers, int workers, int64_t size, int iters, int repeats,
                    std::vector<PsRow>* rows) {
  std::vector<std::string> texts;
  if (!RunJobProcs(servers, workers,
                   {"--size=" + std::to_string(size), "--iters=" + std::to_string(iters), "--repeats=" + std::to_string(repeats),
                    "--servers=" + std::to_string(servers), "--path=" + path},
                   std::to_string(size) + " floats", &texts)) {
    return false;
  }
  // t0/t1 per (op, repeat) over the workers; latencies per op; wrong values.
  std::vector<std::vector<int64_t>> t0(3, std::vector<int64_t>(static_cast<size_t>(repeats), INT64_MAX)),
      t1(3, std::vector<int64_t>(static_cast<size_t>(repeats), 0));
  std::vector<std::vector<double>> lat(3);
  int64_t wrong = 0;
  int lines = 0;
  for (const std::string& text : texts) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string tag;
      ls >> tag;
      if (tag == "R") {
        int k = 0, r = 0;
        int64_t a = 0, b = 0;
        ls >> k >> r >> a >> b;
        if (k < 0 || k > 2 || r < 0 || r >= repeats) continue;
        t0[static_cast<size_t>(k)][static_cast<size_t>(r)] = std::min(t0[static_cast<size_t>(k)][static_cast<size_t>(r)], a);
        t1[static_cast<size_t>(k)][static_cast<size_t>(r)] = std::max(t1[static_cast<size_t>(k)][static_cast<size_t>(r)], b);
        ++lines;
      } else if (tag == "L") {
        int k = 0;
        ls >> k;
        double v = 0;
        while (ls >> v) lat[static_cast<size_t>(k)].push_back(v);
      } else if (tag == "W") {
        int64_t n = 0;
        ls >> n;
        wrong += n;
      }
    }
  }
  if (lines != 3 * repeats * workers) {
    std::fprintf(stderr, "gradsync-bench-ps: %dx%d: the workers reported %d repeats, not %d\n", servers, workers, lines,
                 3 * repeats * workers);
    return false;
  }
  const int64_t shard_floats = (size + servers - 1) / servers;
  for (size_t k = 0; k < 3; ++k) {
    const double per_op = (k == 2 ? 2.0 : 1.0) * static_cast<double>(size) * sizeof(float);
    std::vector<double> rates;
    for (size_t r = 0; r < static_cast<size_t>(repeats); ++r) {
      rates.push_back(per_op * iters * workers / (static_cast<double>(t1[k][r] - t0[k][r]) / 1e9) / 1e9);
    }
    rows->push_back({path, kOps[k], servers, workers, size, Median(rates), Quantile(lat[k], 0.5), Quantile(lat[k], 0.99), wrong,
                     shard_floats * static_cast<int64_t>(sizeof(float))});
  }
  return true;
}

// The frames of a small request and its reply with these bytes per message (to / from one shard):
// a request is header + keys + values (push) or header + keys (pull); a reply the header (push)
// or header + keys + values (pull). Keys split evenly over the shards (on average); the header
// takes the rest of the bytes, rounded to the byte.
std::pair<std::string, std::string> SmallFrames(bool push, int keys, int servers, double request_bytes,
                                                double reply_bytes) {
  const int64_t k = keys / servers;
  const int64_t payload = k * 8 + (push ? k * 4 : 0), reply_payload = push ? 0 : k * 12;
  const int64_t req_header = std::max<int64_t>(1, std::llround(request_bytes) - payload);
  const int64_t rep_header = std::max<int64_t>(1, std::llround(reply_bytes) - reply_payload);
  std::string req = std::to_string(req_header) + "," + std::to_string(k * 8);
  if (push) req += "," + std::to_string(k * 4);
  std::string rep = std::to_string(rep_header);
  if (!push) rep += "," + std::to_string(k * 8) + "," + std::to_string(k * 4);
  return {req, rep};
}

int64_t FramesBytes(const std::string& frames) {
  int64_t n = 0;
  std::stringstream ss(frames);
  std::string item;
  while (std::getline(ss, item, ',')) n += std::stoll(item);
  return n;
}

// Small requests of one configuration: a sparse push row and a sparse pull row, each beside its
// REQ/REP ceiling, interleaved. The PS job and the ceiling's processes (`servers` REP receivers,
// `workers` senders with one REQ per receiver) stay up together; per repeat the PS workers run
// `iters` operations, then the ceiling runs `iters` round trips with the frames of exactly the
// bytes those operations measured (one untimed ceiling round first), so that a noisy spell of
// the machine hits both alike. False when a child failed or a deadline passed.
bool RunSmallProcs(int servers, int workers, int keys, int iters, int repeats, std::vector<SmallRow>* rows) {
  const std::string what = std::to_string(servers) + "x" + std::to_string(workers) + " small requests";
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "gradsync-bench-ps: %s: %s\n", what.c_str(), why.c_str());
    return false;
  };
  Children kids;
  Job job;
  if (!StartJob(kids, servers, workers,
                {"--keys=" + std::to_string(keys), "--iters=" + std::to_string(iters), "--repeats=" + std::to_string(repeats)},
                true, &job)) {
    return false;
  }
  // The ceiling's processes.
  const std::string self = SelfDir() + "/gradsync-bench-ps";
  const std::vector<std::string> common = {"--kind=reqrep", "--stdin=1", "--iters=" + std::to_string(iters),
                                           "--repeats=" + std::to_string(repeats)};
  std::vector<Child*> rxs, txs;
  std::string ports;
  for (int s = 0; s < servers; ++s) {
    std::vector<std::string> args = {self, "--role=ceil-rx", "--clients=" + std::to_string(workers)};
    args.insert(args.end(), common.begin(), common.end());
    rxs.push_back(kids.Spawn(args, true, "ceiling receiver", true));
    if (!Children::ReadLines({rxs.back()}, 1, Clock::now() + std::chrono::seconds(30))) return fail("no ceiling receiver");
    std::istringstream first(rxs.back()->text);
    std::string tag, port;
    first >> tag >> port;
    if (tag != "PORTS") return fail("ceiling receiver said '" + rxs.back()->text + "'");
    ports += (s ? "," : "") + port;
  }
  for (int w = 0; w < workers; ++w) {
    std::vector<std::string> args = {self, "--role=ceil-tx", "--ports=" + ports};
    args.insert(args.end(), common.begin(), common.end());
    txs.push_back(kids.Spawn(args, true, "ceiling sender", true));
  }
  auto deadline = [] { return Clock::now() + std::chrono::seconds(120); };
  // Each worker's last line, split in words.
  auto last_line = [](const Child* c) {
    std::string text = c->text;
    if (!text.empty() && text.back() == '\n') text.pop_back();
    std::istringstream in(text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1));
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    return words;
  };
  if (!Children::ReadLines(job.workers, 1, deadline())) return fail("the workers did not get ready");
  int worker_lines = 1, sender_lines = 0;
  std::vector<double> ps_rates[2], ceil_rates[2], req_bytes[2], rep_bytes[2], ceil_req[2], ceil_rep[2];
  for (int k = 0; k < 2; ++k) {
    for (int r = 0; r < repeats; ++r) {
      for (Child* w : job.workers) {
        if (!Children::Say(w, "go")) return fail("a worker is gone");
      }
      ++worker_lines;
      if (!Children::ReadLines(job.workers, worker_lines, deadline())) return fail("a worker did not finish its repeat");
      int64_t t0 = INT64_MAX, t1 = 0;
      double sent = 0, received = 0;
      for (Child* w : job.workers) {
        const auto words = last_line(w);
        if (words.size() != 7 || words[0] != "R" || words[1] != std::to_string(k) || words[2] != std::to_string(r)) {
          return fail("unexpected line from a worker");
        }
        t0 = std::min<int64_t>(t0, std::stoll(words[3]));
        t1 = std::max<int64_t>(t1, std::stoll(words[4]));
        sent += std::stod(words[5]) / workers;
        received += std::stod(words[6]) / workers;
      }
      ps_rates[k].push_back(static_cast<double>(iters) * workers / (static_cast<double>(t1 - t0) / 1e9));
      req_bytes[k].push_back(sent);
      rep_bytes[k].push_back(received);
      // The ceiling with the bytes this repeat measured (first an untimed round of them).
      const auto [req, rep] = SmallFrames(k == 0, keys, servers, sent, received);
      for (int round = r == 0 ? 0 : 1; round < 2; ++round) {
        for (Child* rx : rxs) {
          if (!Children::Say(rx, "go " + rep + " " + std::to_string(static_cast<int64_t>(iters) * workers))) {
            return fail("a ceiling receiver is gone");
          }
        }
        for (Child* tx : txs) {
          if (!Children::Say(tx, "go " + req)) return fail("a ceiling sender is gone");
        }
        ++sender_lines;
        if (!Children::ReadLines(txs, sender_lines, deadline())) return fail("a ceiling sender did not finish its round");
      }
      int64_t c0 = INT64_MAX, c1 = 0;
      for (Child* tx : txs) {
        const auto words = last_line(tx);
        if (words.size() != 4 || words[0] != "T") return fail("unexpected line from a ceiling sender");
        c0 = std::min<int64_t>(c0, std::stoll(words[2]));
        c1 = std::max<int64_t>(c1, std::stoll(words[3]));
      }
      ceil_rates[k].push_back(static_cast<double>(iters) * workers / (static_cast<double>(c1 - c0) / 1e9));
      ceil_req[k].push_back(static_cast<double>(FramesBytes(req)));
      ceil_rep[k].push_back(static_cast<double>(FramesBytes(rep)));
    }
  }
  for (Child* c : rxs) Children::Say(c, "end");
  for (Child* c : txs) Children::Say(c, "end");
  if (!FinishJob(job, what)) return false;
  std::vector<Child*> ceiling = rxs;
  ceiling.insert(ceiling.end(), txs.begin(), txs.end());
  if (!Children::Read(ceiling, Clock::now() + std::chrono::seconds(30)) ||
      !Children::Reap(ceiling, Clock::now() + std::chrono::seconds(30))) {
    return fail("the ceiling's processes did not exit");
  }
  // Latencies and wrong values, from the workers' last lines.
  std::vector<double> lat[2];
  int64_t wrong = 0;
  for (Child* w : job.workers) {
    std::istringstream in(w->text);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string tag;
      ls >> tag;
      int k = -1;
      if (tag == "L" && ls >> k && (k == 0 || k == 1)) {
        for (double v = 0; ls >> v;) lat[k].push_back(v);
      } else if (tag == "W") {
        int64_t n = 0;
        ls >> n;
        wrong += n;
      }
    }
  }
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
  };
  for (int k = 0; k < 2; ++k) {
    if (lat[k].size() != static_cast<size_t>(iters) * repeats * workers) return fail("latencies missing");
    SmallRow row;
    row.op = kSmallOps[k];
    row.servers = servers;
    row.workers = workers;
    row.keys = keys;
    row.iters = iters;
    row.rtps = Median(ps_rates[k]);
    row.p50_us = Quantile(lat[k], 0.5);
    row.p99_us = Quantile(lat[k], 0.99);
    row.wrong = wrong;
    row.request_bytes = mean(req_bytes[k]);
    row.reply_bytes = mean(rep_bytes[k]);
    row.ceiling = Median(ceil_rates[k]);
    row.ceiling_request_bytes = mean(ceil_req[k]);
    row.ceiling_reply_bytes = mean(ceil_rep[k]);
    std::vector<double> ratios;
    for (size_t r = 0; r < ps_rates[k].size(); ++r) ratios.push_back(ps_rates[k][r] / ceil_rates[k][r]);
    row.paired = Median(ratios);
    rows->push_back(row);
  }
  return true;
}

// One ceiling: receiver and sender processes; the median GB/s over the repeats (bytes_per_op:
// what one operation moves, counted as the PS rows count it). < 0 when it failed.
double CeilingProcs(const std::string& kind, const std::string& op, int64_t bytes, int iters, int repeats) {
  const std::string self = SelfDir() + "/gradsync-bench-ps";
  const std::vector<std::string> common = {"--kind=" + kind, "--op=" + op, "--bytes=" + std::to_string(bytes),
                                           "--iters=" + std::to_string(iters), "--repeats=" + std::to_string(repeats)};
  Children kids;
  std::vector<std::string> rx_args = {self, "--role=ceil-rx"};
  rx_args.insert(rx_args.end(), common.begin(), common.end());
  Child* rx = kids.Spawn(rx_args, true, "ceiling receiver " + kind);
  if (!Children::Read({rx}, Clock::now() + std::chrono::seconds(30), rx, 1)) return -1;
  std::istringstream first(rx->text);
  std::string tag, p1, p2;
  first >> tag >> p1 >> p2;
  if (tag != "PORTS") return -1;
  std::vector<std::string> tx_args = {self, "--role=ceil-tx", "--port=" + p1, "--port2=" + p2};
  tx_args.insert(tx_args.end(), common.begin(), common.end());
  Child* tx = kids.Spawn(tx_args, true, "ceiling sender " + kind);
  if (!Children::Read({tx, rx}, Clock::now() + std::chrono::seconds(300))) return -1;
  if (!Children::Reap({tx, rx}, Clock::now() + std::chrono::seconds(10))) return -1;
  std::istringstream in(tx->text);
  std::vector<double> rates;
  const double per_op = static_cast<double>(bytes) * (op == "pushpull" ? 2.0 : 1.0);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    double secs = 0;
    if (ls >> tag >> secs && tag == "R" && secs > 0) rates.push_back(per_op * iters / secs / 1e9);
  }
  if (static_cast<int>(rates.size()) != repeats) return -1;
  return Median(rates);
}

// ZeroMQ REQ/REP across processes: `servers` REP receiver processes, `workers` sender processes
// each with one REQ per receiver, requests and replies of the given frame sizes ("a,b,c"); per
// repeat the wall time in seconds, the last sender's end minus the first one's start (empty when
// it failed).
std::vector<double> ReqRepSeconds(const std::string& request_frames, const std::string& reply_frames, int iters,
                                  int repeats, int servers, int workers) {
  const std::string self = SelfDir() + "/gradsync-bench-ps";
  const std::vector<std::string> common = {"--kind=reqrep", "--req=" + request_frames, "--rep=" + reply_frames,
                                           "--iters=" + std::to_string(iters), "--repeats=" + std::to_string(repeats)};
  Children kids;
  std::vector<Child*> all;
  std::string ports;
  for (int s = 0; s < servers; ++s) {
    std::vector<std::string> args = {self, "--role=ceil-rx", "--clients=" + std::to_string(workers)};
    args.insert(args.end(), common.begin(), common.end());
    Child* rx = kids.Spawn(args, true, "ceiling receiver");
    all.push_back(rx);
    if (!Children::Read({rx}, Clock::now() + std::chrono::seconds(30), rx, 1)) return {};
    std::istringstream first(rx->text);
    std::string tag, p1;
    first >> tag >> p1;
    if (tag != "PORTS") return {};
    ports += (s ? "," : "") + p1;
  }
  std::vector<Child*> txs;
  for (int w = 0; w < workers; ++w) {
    std::vector<std::string> args = {self, "--role=ceil-tx", "--ports=" + ports};
    args.insert(args.end(), common.begin(), common.end());
    txs.push_back(kids.Spawn(args, true, "ceiling sender"));
    all.push_back(txs.back());
  }
  if (!Children::Read(all, Clock::now() + std::chrono::seconds(300))) return {};
  if (!Children::Reap(all, Clock::now() + std::chrono::seconds(10))) return {};
  std::vector<int64_t> t0(static_cast<size_t>(repeats), INT64_MAX), t1(static_cast<size_t>(repeats), 0);
  int lines = 0;
  for (Child* c : txs) {
    std::istringstream in(c->text);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string tag;
      int r = -1;
      int64_t a = 0, b = 0;
      if (!(ls >> tag >> r >> a >> b) || tag != "T" || r < 0 || r >= repeats) continue;
      t0[static_cast<size_t>(r)] = std::min(t0[static_cast<size_t>(r)], a);
      t1[static_cast<size_t>(r)] = std::max(t1[static_cast<size_t>(r)], b);
      ++lines;
    }
  }
  if (lines != repeats * workers) return {};
  std::vector<double> secs;
  for (size_t r = 0; r < static_cast<size_t>(repeats); ++r) secs.push_back(static_cast<double>(t1[r] - t0[r]) / 1e9);
  return secs;
}

// The REQ/REP ceiling of a configuration for the big rows (push: the shard's message as the
// request and a 16-byte reply; pull: a 16-byte request and the big reply; push+pull: big both
// ways); GB/s counts every sender's bytes as the PS rows do (push+pull: both ways). < 0 when it
// failed.
double ReqRepProcs(const std::string& op, int64_t bytes, int iters, int repeats, int servers, int workers) {
  const std::string big = std::to_string(bytes);
  const auto secs = ReqRepSeconds(op == "pull" ? "16" : big, op == "push" ? "16" : big, iters, repeats, servers, workers);
  if (secs.empty()) return -1;
  const double per_round = static_cast<double>(bytes) * (op == "pushpull" ? 2.0 : 1.0) * iters * servers * workers;
  std::vector<double> rates;
  for (double t : secs) rates.push_back(per_round / t / 1e9);
  return Median(rates);
}

double MemcpyGbps(int64_t bytes, int repeats) {
  std::vector<char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes), 0);
  std::memcpy(b.data(), a.data(), a.size());  // warm-up: pages mapped
  std::vector<double> r;
  for (int i = 0; i < std::max(7, repeats); ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), a.size());
    r.push_back(static_cast<double>(bytes) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
  }
  return Median(r);
}

}  // namespace

bool IsRole(int argc, char** argv) { return argc >= 2 && std::string(argv[1]).rfind("--role=", 0) == 0; }

int RunRole(int argc, char** argv) {
  TuneAllocatorForLargeMessages();
  SetLogLevel(LogLevel::kWarning);
  auto a = RoleArgs(argc, argv);
  const std::string role = a["role"];
  if (role == "worker") {
    if (a.count("kind") && a["kind"] == "rows") return RunRowsWorker(a);
    return a.count("keys") ? RunSmallWorker(a) : RunWorker(a);
  }
  if (role == "ceil-rx") return RunCeiling(a, true);
  if (role == "ceil-tx") return RunCeiling(a, false);
  std::fprintf(stderr, "gradsync-bench-ps: error: unknown --role '%s'\n", role.c_str());
  return 2;
}

int RunProcesses(const std::vector<int64_t>& sizes, const std::vector<std::pair<int, int>>& configs,
                 const std::vector<std::string>& paths, int iters_flag, int repeats, int small_keys, int small_iters,
                 const std::string& json_path) {
  const std::string server_bin = SelfDir() + "/gradsync-server";
  if (::access(server_bin.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "gradsync-bench-ps: error: --processes needs %s (build it)\n", server_bin.c_str());
    return 1;
  }
  ::setenv("GRADSYNC_LOG_LEVEL", "warning", 1);
  ::signal(SIGPIPE, SIG_IGN);  // a fed child that died fails Say, not this process
  auto iters_for = [&](int64_t size) { return iters_flag > 0 ? iters_flag : (size <= (4 << 20) ? 20 : 6); };
  std::printf("# gradsync-bench-ps --processes: scheduler and shards are gradsync-server processes, each worker a process; "
              "median of %d repeats; latency per op over all repeats\n",
              repeats);
  std::fflush(stdout);
  std::vector<PsRow> rows;
  std::vector<CeilRow> ceilings;
  std::vector<SmallRow> small;
  bool failed = false;
  // Small requests first (they take seconds), each row's REQ/REP ceiling interleaved with it.
  if (small_keys > 0) {
    for (auto [s, w] : configs) {
      if (!RunSmallProcs(s, w, small_keys, small_iters, repeats, &small)) {
        std::fprintf(stderr, "gradsync-bench-ps: %dx%d small requests of %d keys failed\n", s, w, small_keys);
        failed = true;
      }
    }
  }
  // Each configuration's REQ/REP ceilings (its topology, its shard message size) right after it.
  for (int64_t size : sizes) {
    const int iters = iters_for(size);
    for (auto [s, w] : configs) {
      for (const std::string& path : paths) {
        if (!RunConfigProcs(path, s, w, size, iters, repeats, &rows)) {
          std::fprintf(stderr, "gradsync-bench-ps: %s %dx%d %lld floats failed\n", path.c_str(), s, w,
                       static_cast<long long>(size));
          failed = true;
        }
      }
      const int64_t bytes = (size + s - 1) / s * static_cast<int64_t>(sizeof(float));
      for (const char* op : {"push", "pull", "pushpull"}) {
        ceilings.push_back({std::string("zmq-reqrep-") + op, s, w, bytes, iters, ReqRepProcs(op, bytes, iters, repeats, s, w)});
      }
    }
  }
  // One stream of every message size: ZeroMQ PUSH/PULL, TCP, memcpy.
  std::set<std::pair<int64_t, int>> msgs;  // bytes, iters
  for (const CeilRow& c : ceilings) msgs.insert({c.bytes, c.iters});
  for (auto [bytes, iters] : msgs) {
    ceilings.push_back({"zmq-push/pull", 1, 1, bytes, iters, CeilingProcs("stream", "push", bytes, iters, repeats)});
    ceilings.push_back({"tcp-stream", 1, 1, bytes, iters, CeilingProcs("tcp", "push", bytes, iters, repeats)});
    ceilings.push_back({"memcpy", 0, 0, bytes, iters, MemcpyGbps(bytes, repeats)});
  }
  for (const CeilRow& c : ceilings) failed |= c.gbps < 0;
  if (!small.empty()) {
    std::printf("# small requests: one sparse tensor of %lld floats; each op sends every shard its part of %d sorted "
                "unique random keys (push: with their values) and waits for every reply; rt/s = all workers' ops / wall "
                "time, median of %d repeats of %d ops; latency per op over all repeats; req/rep_bytes: one request / reply "
                "to one shard, every frame, measured (mean over repeats)\n",
                static_cast<long long>(kSmallRows), small_keys, repeats, small_iters);
    std::printf("# ceil_rt/s: ZeroMQ REQ/REP across processes (SERVERS REP processes, WORKERS sender processes, one REQ "
                "per REP), each repeat right after the PS repeat with the frames and bytes it measured; vs_ceiling = "
                "rt/s / ceil_rt/s (medians); paired = median over repeats of the same ratio within a repeat\n");
    std::printf("%-12s %7s %7s %6s %9s %9s %9s %9s %9s %7s %10s %10s %7s\n", "op", "servers", "workers", "keys",
                "req_bytes", "rep_bytes", "rt/s", "p50_us", "p99_us", "#wrong", "ceil_rt/s", "vs_ceiling", "paired");
    for (const SmallRow& r : small) {
      std::printf("%-12s %7d %7d %6d %9.0f %9.0f %9.0f %9.1f %9.1f %7lld %10.0f %10.2f %7.2f\n", r.op.c_str(), r.servers,
                  r.workers, r.keys, r.request_bytes, r.reply_bytes, r.rtps, r.p50_us, r.p99_us,
                  static_cast<long long>(r.wrong), r.ceiling, r.ceiling > 0 ? r.rtps / r.ceiling : 0.0, r.paired);
    }
  }
  if (!rows.empty()) {
    std::printf("# GB/s of values (1e9 B); vs_ceiling = GB/s over the ZeroMQ REQ/REP ceiling of the shard's message size "
                "(push: big request, small reply; pull: small request, big reply; push+pull: big both ways), same topology "
                "(SERVERS receiver and WORKERS sender processes), same run\n");
    std::printf("# path: zmq (values over ZeroMQ), tcp (values over a data channel, headers over ZeroMQ) or shm (values "
                "through shared-memory lanes, headers over ZeroMQ); vs_zmq, vs_tcp = GB/s over the zmq, tcp row's of the "
                "same op and configuration\n");
    std::printf("%-5s %-10s %7s %7s %10s %10s %9s %9s %9s %7s %10s %10s %7s %7s\n", "path", "op", "servers", "workers",
                "floats", "msg_bytes", "GB/s", "p50_ms", "p99_ms", "#wrong", "ceil_GB/s", "vs_ceiling", "vs_zmq", "vs_tcp");
  }
  for (PsRow& r : rows) {
    const std::string want = r.op == "push" ? "zmq-reqrep-push" : r.op == "pull" ? "zmq-reqrep-pull" : "zmq-reqrep-pushpull";
    for (const CeilRow& c : ceilings) {
      if (c.name == want && c.bytes == r.msg_bytes && c.servers == r.servers && c.workers == r.workers) r.ceiling = c.gbps;
    }
    for (const PsRow& t : rows) {
      if (t.op == r.op && t.servers == r.servers && t.workers == r.workers && t.size == r.size && t.gbps > 0) {
        if (t.path == "tcp") r.vs_tcp = r.gbps / t.gbps;
        if (t.path == "zmq") r.vs_zmq = r.gbps / t.gbps;
      }
    }
    auto ratio = [](double v) { return v > 0 ? std::to_string(v).substr(0, 4) : std::string("-"); };
    std::printf("%-5s %-10s %7d %7d %10lld %10lld %9.2f %9.3f %9.3f %7lld %10.2f %10.2f %7s %7s\n", r.path.c_str(),
                r.op.c_str(), r.servers, r.workers, static_cast<long long>(r.size), static_cast<long long>(r.msg_bytes), r.gbps,
                r.p50_ms, r.p99_ms, static_cast<long long>(r.wrong), r.ceiling, r.ceiling > 0 ? r.gbps / r.ceiling : 0.0,
                ratio(r.vs_zmq).c_str(), ratio(r.vs_tcp).c_str());
  }
  if (!ceilings.empty()) {
    std::printf("# ceilings, same run: separate processes over 127.0.0.1 (memcpy: in this process), zero-copy ZeroMQ "
                "sends, median of %d repeats of iters operations; reqrep: SERVERS REP processes, WORKERS sender processes "
                "each with one REQ per REP, every op sent to all and then every reply read; push/pull and tcp: one stream\n",
                repeats);
    std::printf("%-20s %7s %7s %10s %6s %9s\n", "ceiling", "servers", "workers", "msg_bytes", "iters", "GB/s");
  }
  for (const CeilRow& c : ceilings) {
    std::printf("%-20s %7s %7s %10lld %6d %9.2f\n", c.name.c_str(), c.servers ? std::to_string(c.servers).c_str() : "-",
                c.workers ? std::to_string(c.workers).c_str() : "-", static_cast<long long>(c.bytes), c.iters, c.gbps);
  }
  int64_t wrong = 0;
  for (const PsRow& r : rows) wrong += r.wrong;
  for (const SmallRow& r : small) wrong += r.wrong;
  std::printf("# check: %s%s\n", wrong == 0 ? "every pulled value correct" : "WRONG VALUES",
              failed ? "; SOME RUNS FAILED (see stderr)" : "");
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << "{\"processes\": true, \"ps\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const PsRow& r = rows[i];
      f << (i ? ", " : "") << "{\"op\": \"" << r.op << "\", \"servers\": " << r.servers << ", \"workers\": " << r.workers
        << ", \"floats\": " << r.size << ", \"msg_bytes\": " << r.msg_bytes << ", \"gbps\": " << r.gbps
        << ", \"p50_ms\": " << r.p50_ms << ", \"p99_ms\": " << r.p99_ms << ", \"wrong\": " << r.wrong
        << ", \"ceiling_gbps\": " << r.ceiling << ", \"vs_ceiling\": " << (r.ceiling > 0 ? r.gbps / r.ceiling : 0.0)
        << ", \"path\": \"" << r.path << "\", \"vs_zmq\": " << r.vs_zmq << ", \"vs_tcp\": " << r.vs_tcp << "}";
    }
    f << "], \"ceilings\": [";
    for (size_t i = 0; i < ceilings.size(); ++i) {
      const CeilRow& c = ceilings[i];
      f << (i ? ", " : "") << "{\"name\": \"" << c.name << "\", \"servers\": " << c.servers << ", \"workers\": " << c.workers
        << ", \"msg_bytes\": " << c.bytes << ", \"iters\": " << c.iters
        << ", \"gbps\": " << c.gbps << "}";
    }
    f << "], \"small\": [";
    for (size_t i = 0; i < small.size(); ++i) {
      const SmallRow& r = small[i];
      f << (i ? ", " : "") << "{\"op\": \"" << r.op << "\", \"servers\": " << r.servers << ", \"workers\": " << r.workers
        << ", \"keys\": " << r.keys << ", \"iters\": " << r.iters << ", \"request_bytes\": " << r.request_bytes
        << ", \"reply_bytes\": " << r.reply_bytes << ", \"round_trips_per_s\": " << r.rtps << ", \"p50_us\": " << r.p50_us
        << ", \"p99_us\": " << r.p99_us << ", \"wrong\": " << r.wrong << ", \"ceiling_round_trips_per_s\": " << r.ceiling
        << ", \"ceiling_request_bytes\": " << r.ceiling_request_bytes << ", \"ceiling_reply_bytes\": " << r.ceiling_reply_bytes
        << ", \"vs_ceiling\": " << (r.ceiling > 0 ? r.rtps / r.ceiling : 0.0) << ", \"vs_ceiling_paired\": " << r.paired << "}";
    }
    f << "]}\n";
  }
  return wrong == 0 && !failed ? 0 : 1;
}

}  // namespace gradsync::psbench
