// fuzz_message: the network message decoder, through the real receive path.
//
// Every message gradsync receives goes through gradsync::Socket::Recv (common/net/transport.h),
// which parses the protobuf header frame, checks the keys and values frames against it, and
// marks what fails `malformed`. This target sends the fuzz input as ZeroMQ frames from a raw
// socket over inproc:// to a gradsync Socket (a ROUTER, as a server has, or a PAIR, the
// non-ROUTER path) and calls Recv; transport code is not touched.
//
// The first input byte picks the socket (bit 0) and how the frames are made (bit 1):
//   raw         byte 1 picks 1-4 frames; each frame but the last takes a 2-byte length, the
//               last takes the rest (so any bytes at all reach the header parser);
//   structured  a wire::Header with fuzzer-chosen fields (type, sender, clock, segments, keys,
//               codec, the INIT job), serialized by protobuf, then keys and values frames that
//               usually fit it (values may be a real codec payload), sometimes one frame
//               dropped or added; this gets past the parse into the size checks and beyond.
//
// A message Recv does not mark malformed must keep transport.h's promises (the keys frame is
// num_keys uint64s, a raw values frame is ExpectedValueCount floats, segments do not
// overflow) and then goes through the server's checks that live outside the Server class, in
// the order server.cc applies them: KvShard::Validate (ranges, keys), the codec's Decode of a
// compressed push, ConsistencyController's clock rules, then the shard update or read, on a
// fresh two-shard model (a dense tensor, a sparse one, a dense one) per input. Anything
// server.cc relies on and nothing checks (segments that overlap) fails the run too.
//
// A REPLICATE goes to a backup's store (server/replication.h) that holds whole copies of both
// shards, each bound to its primary's connection: arriving on the fuzzer's connection (a
// stranger's), it must be refused and leave both copies whole and bit for bit as they were,
// unless it is a snapshot with the job's key from the shard's own rank (a primary's new
// connection: it may start the copy over); the same entry then as if from the primary may be
// refused or applied, but must not crash.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/base/numeric/tensor.h"
#include "common/net/control/control_protocol.h"
#include "common/net/transport.h"
#include "common/optim/optimizer.h"
#include "common/ps/consistency.h"
#include "common/ps/partitioner.h"
#include "common/ps/ps_protocol.h"
#include "common/ps/replica_protocol.h"
#include "compression/compressor.h"
#include "server/replication/replication.h"
#include "server/shard/kv/kv_shard.h"

namespace {

using gradsync::Message;
using gradsync::Socket;
namespace wire = gradsync::wire;

// FUZZ_VERBOSE=1: one line per input (the frames, what Recv made of them, how far the checks
// went), to read a crasher.
bool Verbose() {
  static const bool v = std::getenv("FUZZ_VERBOSE") != nullptr;
  return v;
}

void Note(const std::string& what) {
  if (Verbose()) std::fprintf(stderr, "  %s\n", what.c_str());
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_message: %s\n", what.c_str());
  std::abort();
}

// The model every input is checked against: 3100 parameters on two shards.
constexpr int64_t kNumParams = 3100;
constexpr int kNumWorkers = 4;
constexpr uint64_t kCodecSeed = 11;
constexpr size_t kMaxDecoded = size_t{1} << 16;
const std::string kReplicaKey = "fuzz-replica-key";  // the job's replication key

std::vector<gradsync::TensorInfo> Layout() {
  return {{"dense0", {1000}, 0, 1000, false}, {"emb", {2048}, 1000, 2048, true}, {"dense1", {52}, 3048, 52, false}};
}

// The job of that model (momentum SGD: one optimizer state vector), and a snapshot's META of
// shard `s`.
wire::JobConfig Job() {
  wire::JobConfig job;
  for (const auto& t : Layout()) {
    auto* j = job.add_tensors();
    j->set_name(t.name);
    j->set_offset(static_cast<uint64_t>(t.offset));
    j->set_size(static_cast<uint64_t>(t.size));
    j->set_sparse(t.sparse);
  }
  job.set_num_params(kNumParams);
  job.set_num_workers(kNumWorkers);
  job.set_lr(0.1f);
  job.set_lr_schedule("constant");
  gradsync::OptimizerOptions o;
  o.momentum = 0.9f;
  gradsync::SetJobOptimizer(o, &job);
  return job;
}

wire::ShardCheckpoint Meta(int s) {
  const gradsync::Partitioner part(kNumParams, 2);
  wire::ShardCheckpoint c;
  c.set_rank(s);
  *c.mutable_job() = Job();
  c.set_begin(static_cast<uint64_t>(part.range(s).begin));
  c.set_end(static_cast<uint64_t>(part.range(s).end));
  c.set_optimizer("sgd");
  return c;
}

struct Endpoints {
  gradsync::TransportContext ctx{1};
  std::unique_ptr<Socket> router;  // gradsync side, as a server binds it
  std::unique_ptr<Socket> pair;    // gradsync side, a non-ROUTER socket
  std::unique_ptr<zmq::socket_t> to_router;
  std::unique_ptr<zmq::socket_t> to_pair;
};

Endpoints& Get() {
  static Endpoints* e = [] {
    auto* p = new Endpoints();
    auto r = Socket::Bind(p->ctx, zmq::socket_type::router, "inproc://fuzz-router", 0);
    auto q = Socket::Bind(p->ctx, zmq::socket_type::pair, "inproc://fuzz-pair", 0);
    if (!r.ok() || !q.ok()) Fail("cannot bind the inproc sockets");
    p->router = std::make_unique<Socket>(std::move(*r));
    p->pair = std::make_unique<Socket>(std::move(*q));
    p->to_router = std::make_unique<zmq::socket_t>(p->ctx, zmq::socket_type::dealer);
    p->to_pair = std::make_unique<zmq::socket_t>(p->ctx, zmq::socket_type::pair);
    for (auto* s : {p->to_router.get(), p->to_pair.get()}) {
      s->set(zmq::sockopt::linger, 0);
      s->set(zmq::sockopt::sndtimeo, 1000);
    }
    p->to_router->connect("inproc://fuzz-router");
    p->to_pair->connect("inproc://fuzz-pair");
    return p;
  }();
  return *e;
}

using Frames = std::vector<std::string>;

Frames RawFrames(const uint8_t* data, size_t size) {
  Frames frames;
  if (size == 0) return {std::string()};
  const int count = (data[0] & 3) + 1;
  size_t pos = 1;
  for (int f = 0; f + 1 < count; ++f) {
    size_t len = 0;
    if (pos + 2 <= size) len = data[pos] | (size_t{data[pos + 1]} << 8);
    pos = std::min(size, pos + 2);
    len = std::min(len, size - pos);
    frames.emplace_back(reinterpret_cast<const char*>(data + pos), len);
    pos += len;
  }
  frames.emplace_back(reinterpret_cast<const char*>(data + pos), size - pos);
  return frames;
}

const char* const kCodecNames[] = {"", "fp16", "int8", "qsgd:4", "qsgd:16", "sign", "topk:0.01", "randomk:0.01", "bogus"};

uint64_t SmallOrAny(FuzzedDataProvider& in, uint64_t small_max) {
  return in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>() : in.ConsumeIntegralInRange<uint64_t>(0, small_max);
}

// A count: small, anything, or small plus a multiple of 2^61 (where count * 8 wraps around).
uint64_t Count(FuzzedDataProvider& in, uint64_t small_max) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: return in.ConsumeIntegral<uint64_t>();
    case 1: return (uint64_t{1} << 61) * in.ConsumeIntegralInRange<uint64_t>(1, 7) + in.ConsumeIntegralInRange<uint64_t>(0, small_max);
    default: return in.ConsumeIntegralInRange<uint64_t>(0, small_max);
  }
}

// A replica plane's fields (a snapshot's META among them, sometimes a real one).
void FillReplicaFields(FuzzedDataProvider& in, wire::ReplicaFields* r) {
  const int s = in.ConsumeIntegralInRange<int>(-1, 2);
  r->set_shard(s);
  r->set_op(static_cast<wire::ReplicaOp>(in.ConsumeIntegralInRange<int>(0, 8)));
  r->set_index(in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>() : in.ConsumeIntegralInRange<uint64_t>(0, 8));
  r->set_part(in.ConsumeIntegralInRange<int>(-1, 2));
  r->set_worker(in.ConsumeIntegralInRange<int>(-1, kNumWorkers));
  r->set_scale(in.ConsumeFloatingPoint<float>());
  r->set_counts(in.ConsumeBool());
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {  // the key: none, the job's, other bytes
    case 1: r->set_key(kReplicaKey); break;
    case 2: r->set_key(in.ConsumeRandomLengthString(32)); break;
    default: break;
  }
  r->set_meta(in.ConsumeBool() && s >= 0 && s < 2 ? Meta(s).SerializeAsString() : in.ConsumeRandomLengthString(256));
}

// A job as INIT carries it: tensors that tile the parameters or not, and any settings.
void FillJob(FuzzedDataProvider& in, wire::JobConfig* job) {
  const int tensors = in.ConsumeIntegralInRange<int>(0, 3);
  uint64_t next = 0;
  for (int i = 0; i < tensors; ++i) {
    auto* t = job->add_tensors();
    t->set_offset(in.ConsumeBool() ? next : SmallOrAny(in, 4096));
    t->set_size(SmallOrAny(in, 4096));
    t->set_sparse(in.ConsumeBool());
    next = t->offset() + t->size();
  }
  job->set_num_params(in.ConsumeBool() ? next : SmallOrAny(in, 8192));
  job->set_num_workers(in.ConsumeIntegralInRange<int>(0, kNumWorkers + 1));
  job->set_lr(in.ConsumeFloatingPoint<float>());
  job->set_lr_schedule(in.ConsumeBool() ? "cosine" : in.ConsumeRandomLengthString(12));
  job->set_momentum(in.ConsumeFloatingPoint<float>());
  job->set_nesterov(in.ConsumeBool());
  job->set_weight_decay(in.ConsumeFloatingPoint<float>());
  job->set_compression(kCodecNames[in.ConsumeIntegralInRange<size_t>(0, std::size(kCodecNames) - 1)]);
  job->set_compression_seed(kCodecSeed);
}

// A keys frame for `num_keys` keys: with `fit` (and few keys), that many keys, sorted or not;
// else any bytes.
std::string KeysFrame(FuzzedDataProvider& in, uint64_t num_keys, bool fit) {
  std::string keys;
  const uint64_t key_bytes = num_keys * sizeof(uint64_t);  // as a sender computes it (64-bit)
  if (fit && key_bytes <= 256 * sizeof(uint64_t)) {
    const bool sorted = in.ConsumeBool();
    uint64_t k = in.ConsumeIntegralInRange<uint64_t>(0, kNumParams);
    for (uint64_t i = 0; i < key_bytes / sizeof(uint64_t); ++i) {
      keys.append(reinterpret_cast<const char*>(&k), 8);
      k = sorted ? k + 1 + in.ConsumeIntegralInRange<uint64_t>(0, 64) : in.ConsumeIntegralInRange<uint64_t>(0, kNumParams);
    }
  } else {
    keys = in.ConsumeRandomLengthString(2048);
  }
  return keys;
}

// A values frame for the header: with `fit`, a real payload of its codec or raw floats of its
// size (`clock` seeds the codec); else any bytes.
std::string ValuesFrame(FuzzedDataProvider& in, const wire::Header& h, int64_t clock, bool fit) {
  std::string values;
  auto want = gradsync::ExpectedValueCount(h);
  if (fit && want.ok() && !h.codec().empty() && in.ConsumeBool()) {
    // A real payload of the named codec (when it is one) for the dense segments.
    uint64_t n = 0;
    for (const auto& s : h.segments()) n += s.length();
    auto codec = gradsync::CreateCompressor(h.codec(), kCodecSeed);
    if (codec.ok() && *codec && n <= kMaxDecoded) {
      std::vector<float> x(n);
      for (auto& v : x) v = in.ConsumeFloatingPointInRange<float>(-4.0f, 4.0f);
      std::vector<uint8_t> payload;
      (*codec)->Encode(x, static_cast<uint64_t>(clock), &payload);
      values.assign(payload.begin(), payload.end());
    }
  } else if (fit && want.ok() && h.codec().empty() && *want <= kMaxDecoded) {
    values.resize(*want * sizeof(float));
    const std::string bytes = in.ConsumeBytesAsString(values.size());
    std::copy(bytes.begin(), bytes.end(), values.begin());
  } else {
    values = in.ConsumeRandomLengthString(4096);
  }
  return values;
}

Frames StructuredFrames(FuzzedDataProvider& in) {
  wire::Header h;
  const int type = in.ConsumeIntegralInRange<int>(0, 22);
  h.set_type(type == 22 ? wire::REPLICATE : static_cast<wire::Type>(type));
  // The plane's fields: mostly the type's own plane, sometimes another (every decoder refuses
  // those), sometimes none.
  const int plane = in.ConsumeIntegralInRange<int>(0, 7);
  const bool replica = plane == 1 || (plane > 3 && h.type() == wire::REPLICATE);
  if (replica) {
    FillReplicaFields(in, h.mutable_replica());
  } else if (plane == 2) {
    wire::ControlFields* c = h.mutable_control();
    c->set_clock(in.ConsumeIntegralInRange<int64_t>(-1, 3));
    c->set_barrier(in.ConsumeRandomLengthString(12));
    c->set_max_message_bytes(SmallOrAny(in, 1 << 20));
  }
  h.set_sender_role(static_cast<wire::Role>(in.ConsumeIntegralInRange<int>(0, 3)));
  h.set_sender_rank(in.ConsumeIntegralInRange<int>(-1, kNumWorkers));
  h.set_request_id(in.ConsumeIntegral<uint64_t>());
  wire::PsFields scratch;  // the PS fields, consumed alike whether they are sent or not
  wire::PsFields* ps = (plane == 0 || (plane > 3 && !replica)) ? h.mutable_ps() : &scratch;
  ps->set_clock(in.ConsumeBool() ? in.ConsumeIntegral<int64_t>() : in.ConsumeIntegralInRange<int64_t>(-1, 3));
  ps->set_version(in.ConsumeBool() ? in.ConsumeIntegral<int64_t>() : in.ConsumeIntegralInRange<int64_t>(-1, 3));
  const int segments = in.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < segments; ++i) {
    auto* s = h.add_segments();
    s->set_offset(SmallOrAny(in, kNumParams + 8));
    s->set_length(SmallOrAny(in, kNumParams + 8));
  }
  const uint64_t num_keys = Count(in, 16);
  h.set_num_keys(num_keys);
  h.set_has_values(in.ConsumeBool());
  h.set_codec(kCodecNames[in.ConsumeIntegralInRange<size_t>(0, std::size(kCodecNames) - 1)]);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {  // a value channel (ValueRef), sometimes one that cannot be
    auto* v = ps->mutable_values_at();
    v->set_channel(static_cast<wire::Channel>(in.ConsumeIntegralInRange<int>(0, 3)));
    v->set_seq(SmallOrAny(in, 4));
    if (in.ConsumeBool()) v->set_attach(in.ConsumeRandomLengthString(24));
    if (in.ConsumeBool()) v->set_port(in.ConsumeIntegral<uint32_t>());
  }
  if (h.type() == wire::INIT || in.ConsumeIntegralInRange<int>(0, 7) == 0) FillJob(in, ps->mutable_job());
  Frames frames;
  std::string header;
  if (!h.SerializeToString(&header)) Fail("cannot serialize a header");
  frames.push_back(std::move(header));

  const bool fit = in.ConsumeIntegralInRange<int>(0, 7) != 0;  // frames that fit the header
  if (num_keys > 0) frames.push_back(KeysFrame(in, num_keys, fit));
  if (h.has_values()) frames.push_back(ValuesFrame(in, h, ps->clock(), fit));
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: if (frames.size() > 1) frames.pop_back(); break;
    case 1: frames.push_back(in.ConsumeRandomLengthString(64)); break;
    default: break;
  }
  return frames;
}

// What transport.h promises about a message it did not mark malformed.
void CheckTransportContract(const Message& m) {
  const auto& h = m.header;
  if (h.type() == wire::TYPE_UNSPECIFIED || !wire::Type_IsValid(h.type())) Fail("accepted an unknown message type");
  if (m.keys.size() % sizeof(uint64_t) != 0 || m.keys.size() / sizeof(uint64_t) != h.num_keys()) {
    Fail("accepted a keys frame of " + std::to_string(m.keys.size()) + " bytes for num_keys " + std::to_string(h.num_keys()));
  }
  auto want = gradsync::ExpectedValueCount(h);
  if (!want.ok()) Fail("accepted segments that overflow: " + want.status().message());
  if (h.has_values() && h.codec().empty() && m.values.size() != *want * sizeof(float)) {
    Fail("accepted a values frame of " + std::to_string(m.values.size()) + " bytes for " + std::to_string(*want) + " floats");
  }
  if (!h.has_values() && m.values.size() != 0) Fail("accepted values without has_values");
}

// The server's checks for an INIT that need no Server object (server.cc HandleInit).
void CheckInit(const Message& m) {
  const auto& job = m.header.ps().job();
  uint64_t next = 0;
  for (const auto& t : job.tensors()) {
    if (t.offset() != next || t.size() == 0) return;
    next += t.size();
  }
  if (next != job.num_params() || job.num_params() == 0 || job.num_params() > (uint64_t{1} << 34)) return;
  if (!gradsync::JobOptimizer(job).ok()) return;
  if (!gradsync::ParseLrScheduleKind(job.lr_schedule()).ok()) return;
  if (!job.compression().empty()) (void)gradsync::CreateCompressor(job.compression(), job.compression_seed());
  gradsync::Partitioner part(static_cast<int64_t>(job.num_params()), 2);
  (void)part.range(static_cast<int>(m.header.request_id() & 1));
}

// A push or pull against one shard of the fixture model, as server.cc HandlePush / HandlePull
// do it once the sender is known.
void CheckData(Message& m) {
  const auto& h = m.header;
  const bool push = h.type() == wire::PUSH;
  if (push != h.has_values()) return;  // "a push carries values", "a pull carries no values"
  const int shard_index = static_cast<int>(h.request_id() & 1);
  const gradsync::Partitioner part(kNumParams, 2);
  const gradsync::Segment range = part.range(shard_index);
  const bool aggregate = (h.request_id() >> 1) & 1;
  gradsync::LrSchedule lr;
  gradsync::KvShard shard(range, Layout(), gradsync::OptimizerOptions{0.9f, false, 0.0f}, lr, kNumWorkers, aggregate);

  // The server's own decoding (common/ps/ps_protocol.h) first, as RequestDispatcher::Handle does.
  auto request = gradsync::DecodeRequest(h);
  if (!request.ok()) return Note("DecodeRequest: " + request.status().ToString());
  const std::vector<gradsync::Segment>& segs = request->segments;
  std::vector<uint64_t> scratch;
  const auto key_view = m.Keys(&scratch);  // == num_keys (checked above)
  const std::vector<uint64_t> keys(key_view.begin(), key_view.end());
  size_t n = m.num_values();
  const bool compressed = !h.codec().empty();
  if (compressed && h.num_keys() > 0) return;  // "a compressed ... carries no keys"
  if (auto v = shard.Validate(segs, keys, push && !compressed ? &n : nullptr); !v.ok()) return Note("Validate: " + v.ToString());

  // What server.cc assumes of validated segments (Server::UpdateMirror, the reply and decode
  // buffers sized by their sum): disjoint and inside the shard, so at most range.size() values.
  std::vector<gradsync::Segment> sorted = segs;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  int64_t end = range.begin;
  for (const auto& s : sorted) {
    if (s.size() == 0 && s.begin >= range.begin && s.begin <= range.end) continue;  // empty: overlaps nothing
    if (s.end < s.begin || s.begin < end || s.end > range.end) {
      Fail("KvShard::Validate accepted segments that overlap or leave the shard ([" + std::to_string(s.begin) +
           ", " + std::to_string(s.end) + "), shard [" + std::to_string(range.begin) + ", " +
           std::to_string(range.end) + "))");
    }
    end = s.end;
  }

  gradsync::ConsistencyController controller(
      aggregate ? gradsync::ConsistencyMode::kBsp : gradsync::ConsistencyMode::kAsp, 0, kNumWorkers);
  if (push) {
    const float* values = static_cast<const float*>(m.values.data());
    std::vector<float> decoded;
    if (compressed) {
      auto codec = gradsync::CreateCompressor(h.codec(), kCodecSeed);
      if (!codec.ok() || !*codec) return;
      n = 0;
      for (const auto& s : segs) n += static_cast<size_t>(s.size());
      decoded.resize(n);
      if (auto d = (*codec)->Decode(std::span(static_cast<const uint8_t*>(m.values.data()), m.values.size()), n,
                                    static_cast<uint64_t>(h.ps().clock()), decoded);
          !d.ok()) {
        return Note("Decode: " + d.ToString());
      }
      values = decoded.data();
    }
    if (h.ps().version() < 0 || h.ps().version() > shard.version()) return;
    if (auto c = controller.OnPush(h.sender_rank(), h.ps().clock()); !c.ok()) return Note("OnPush: " + c.ToString());
    std::vector<float> aligned;
    if (reinterpret_cast<uintptr_t>(values) % alignof(float) != 0) {
      aligned.resize(n);
      m.CopyValues(aligned.data());
      values = aligned.data();
    }
    if (aggregate) {
      shard.Accumulate(segs, keys, values);
      shard.ApplyAccumulated(1);
    } else {
      shard.Apply(segs, keys, values);
    }
    Note("push applied");
  } else {
    if (auto c = controller.ValidatePull(h.sender_rank(), h.ps().clock()); !c.ok()) return Note("ValidatePull: " + c.ToString());
    uint64_t total = keys.size();
    for (const auto& s : segs) total += static_cast<uint64_t>(s.size());
    std::vector<float> out(total);
    shard.Read(segs, keys, out.data());
    Note("pull read " + std::to_string(total) + " values");
  }
}

void CheckReplicate(Message& m) {
  const bool aggregates = m.header.request_id() & 1;
  gradsync::ReplicaStore store(2, aggregates ? gradsync::ConsistencyMode::kBsp : gradsync::ConsistencyMode::kAsp, 0, kReplicaKey);
  const gradsync::Partitioner part(kNumParams, 2);
  std::vector<std::vector<float>> before(2);
  for (int s = 0; s < 2; ++s) {
    const gradsync::Segment range = part.range(s);
    std::vector<float> values(static_cast<size_t>(range.size()));
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.001f * static_cast<float>(i) - 0.5f;
    auto entry = [&](wire::ReplicaOp op, uint64_t index, bool with_values) {
      Message e;
      e.peer = "primary";
      e.header.set_type(wire::REPLICATE);
      e.header.set_sender_role(wire::SERVER);
      e.header.set_sender_rank(s);
      e.header.mutable_replica()->set_shard(s);
      e.header.mutable_replica()->set_op(op);
      e.header.mutable_replica()->set_index(index);
      e.header.set_request_id(index + 1);
      if (with_values) {
        auto* seg = e.header.add_segments();
        seg->set_offset(static_cast<uint64_t>(range.begin));
        seg->set_length(static_cast<uint64_t>(range.size()));
        e.header.set_has_values(true);
        e.values = gradsync::Frame::Copy(values.data(), values.size() * sizeof(float));
      }
      return e;
    };
    Message meta = entry(wire::REPLICA_META, 0, false);
    meta.header.mutable_replica()->set_key(kReplicaKey);
    meta.header.mutable_replica()->set_meta(Meta(s).SerializeAsString());
    if (auto st = store.Apply(meta); !st.ok()) Fail("the primary's snapshot was refused: " + st.ToString());
    if (auto st = store.Apply(entry(wire::REPLICA_PARAMS, 1, true)); !st.ok()) Fail("snapshot parameters: " + st.ToString());
    Message state = entry(wire::REPLICA_STATE, 2, true);
    if (auto st = store.Apply(state); !st.ok()) Fail("snapshot state: " + st.ToString());
    if (!store.Complete(s)) Fail("the snapshot did not make a whole copy");
    before[static_cast<size_t>(s)].assign(store.params(s).begin(), store.params(s).end());
  }
  const std::string stranger = m.peer;  // the router's identity of the fuzzer's socket, or ""
  const auto& h = m.header;
  // A snapshot with the job's key from the shard's own rank may start a copy over (a primary's
  // new connection); nothing else from this connection may be taken.
  const bool keyed_snapshot = h.replica().op() == wire::REPLICA_META && h.replica().key() == kReplicaKey &&
                              h.sender_rank() == h.replica().shard();
  // The plane's decoder (common/ps/replica_protocol.h): what it takes, its encoder
  // gives back as it was.
  if (auto e = gradsync::DecodeReplicaEntry(h); e.ok()) {
    const std::string once = gradsync::EncodeReplicaEntry(*e).SerializeAsString();
    auto back = gradsync::DecodeReplicaEntry(gradsync::EncodeReplicaEntry(*e));
    if (!back.ok() || gradsync::EncodeReplicaEntry(*back).SerializeAsString() != once) {
      Fail("a REPLICATE entry does not survive its own encoder: " + back.status().ToString());
    }
  }
  const auto st = store.Apply(m);
  Note("stranger's REPLICATE: " + st.ToString());
  if (st.ok() && !keyed_snapshot) Fail("a stranger's REPLICATE was applied");
  for (int s = 0; s < 2 && !st.ok(); ++s) {  // refused: nothing changed
    const auto now = store.params(s);
    if (!store.Complete(s) || !std::equal(now.begin(), now.end(), before[static_cast<size_t>(s)].begin(),
                                          before[static_cast<size_t>(s)].end())) {
      Fail("a stranger's REPLICATE changed the copy of shard " + std::to_string(s));
    }
  }
  m.peer = "primary";
  Note("as the primary's: " + store.Apply(m).ToString());
  m.peer = stranger;
}

// The control plane's decoder (common/net/control/control_protocol.h): what it takes, its encoder gives back
// as it was.
void CheckControl(const Message& m) {
  auto c = gradsync::DecodeControl(m.header);
  if (!c.ok()) return;
  const std::string once = gradsync::EncodeControl(*c).SerializeAsString();
  auto back = gradsync::DecodeControl(gradsync::EncodeControl(*c));
  if (!back.ok() || gradsync::EncodeControl(*back).SerializeAsString() != once) {
    Fail("a control message does not survive its own encoder: " + back.status().ToString());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Endpoints& e = Get();
  const bool use_router = data[0] & 1;
  Frames frames;
  if (data[0] & 2) {
    FuzzedDataProvider in(data + 1, size - 1);
    frames = StructuredFrames(in);
  } else {
    frames = RawFrames(data + 1, size - 1);
  }
  zmq::socket_t& out = use_router ? *e.to_router : *e.to_pair;
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto flag = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    if (!out.send(zmq::buffer(frames[i]), flag)) Fail("cannot send a frame over inproc");
  }
  Socket& in = use_router ? *e.router : *e.pair;
  auto m = in.Recv(1000);
  // libFuzzer's -timeout alarm (SIGALRM) can interrupt the poll, which Recv reports as a
  // timeout ("interrupted"): the message is still queued, so ask again (5 s in all at most).
  for (int retry = 0; retry < 5 && !m.ok() && m.status().code() == gradsync::StatusCode::kDeadlineExceeded; ++retry) {
    m = in.Recv(1000);
  }
  if (!m.ok()) Fail("Recv failed on a message that was sent: " + m.status().message());
  if (Verbose()) {
    std::string sizes;
    for (const auto& f : frames) sizes += " " + std::to_string(f.size());
    std::fprintf(stderr, "%s frames:%s -> %s\n", use_router ? "router" : "pair", sizes.c_str(),
                 m->malformed.ok() ? m->header.ShortDebugString().substr(0, 300).c_str() : m->malformed.ToString().c_str());
  }
  if (!m->malformed.ok()) return 0;
  CheckTransportContract(*m);
  switch (m->header.type()) {
    case wire::INIT: CheckInit(*m); break;
    case wire::PUSH:
    case wire::PULL: CheckData(*m); break;
    case wire::REPLICATE: CheckReplicate(*m); break;
    case wire::REPLICATE_REPLY:
    case wire::ERROR:
      CheckControl(*m);
      if (auto a = gradsync::DecodeReplicaAck(m->header); a.ok()) {
        auto back = gradsync::DecodeReplicaAck(gradsync::EncodeReplicaAck(*a));
        if (!back.ok() || back->seq != a->seq || back->error.code() != a->error.code()) Fail("a backup's answer changed in its own encoder");
      }
      break;
    default:
      if (gradsync::IsControlType(m->header.type())) CheckControl(*m);
      break;
  }
  return 0;
}
