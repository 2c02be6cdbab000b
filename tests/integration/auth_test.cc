// CURVE on every socket (--auth-dir): a job trains the same with it; peers without the cluster's
// key can neither register nor push nor pull. And a flood of garbage does not change training.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <zmq.hpp>

#include "common/base/numeric/rng.h"
#include "common/data/synthetic.h"
#include "common/net/security.h"
#include "gradsync.pb.h"
#include "tests/support/ps_job.h"
#include "tests/support/temp_dir.h"
#include "tests/support/wire_request.h"

namespace gradsync::testing {
namespace {

PsJobOptions Job(Dataset* data) {
  BlobsOptions bo;
  bo.n = 1600;
  bo.dim = 12;
  bo.classes = 4;
  bo.center_scale = 0.8f;
  *data = MakeGaussianBlobs(bo);
  PsJobOptions o;
  o.mode = ConsistencyMode::kBsp;  // deterministic: runs can be compared bit for bit
  o.num_servers = 2;
  o.num_workers = 2;
  o.model.name = "mlp";
  o.model.input_dim = 12;
  o.model.num_classes = 4;
  o.model.hidden = {16};
  o.train.batch = 8;
  o.train.epochs = 100;
  o.train.max_steps = 150;
  o.train.seed = 3;
  o.train.lr = {LrSchedule::Kind::kConstant, 0.05f, 150, 0.0f};
  o.train.optimizer.momentum = 0.9f;
  // 20 ms per step: the job runs for ~3 s, so the probes and the flood meet it training.
  o.delay_ms = [](int, int64_t) { return 20.0; };
  return o;
}

// A PULL of the whole first tensor as worker 0 would send it.
std::string PullHeader() {
  wire::Header h = WorkerRequest(wire::PULL, 0, 0, 0, 4);
  h.set_request_id(77);
  return h.SerializeAsString();
}

// Sends a PULL from `s` and reports whether anything came back within `ms`.
bool AnsweredWithin(zmq::socket_t& s, int ms) {
  const std::string h = PullHeader();
  (void)s.send(zmq::buffer(h), zmq::send_flags::dontwait);
  zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
  return zmq::poll(&item, 1, std::chrono::milliseconds(ms)) > 0;
}

TEST(AuthTest, CurveJobTrainsLikePlaintextAndStrangersGetNothing) {
  TempDir dir;
  ASSERT_TRUE(WriteClusterKeys(dir.path(), false).ok());
  EXPECT_EQ(WriteClusterKeys(dir.path(), false).code(), StatusCode::kFailedPrecondition);  // no silent overwrite
  for (const char* secret : {"server.key", "client.key"}) {  // created private, never widened
    const auto perms = std::filesystem::status(dir.path() + "/" + secret).permissions();
    EXPECT_EQ(perms, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write) << secret;
  }
  auto sec = LoadSecurity(dir.path());
  ASSERT_TRUE(sec.ok()) << sec.status();
  Dataset data;
  PsJobOptions o = Job(&data);
  PsJobResult plain = RunPsJob(o, data, data);
  ASSERT_TRUE(plain.status.ok()) << plain.status;

  o.security = *sec;
  o.shm = false;
  o.data_min_floats = 1;  // every request would use a data channel, were there one: there is none
  std::vector<bool> answered;
  o.side_task = [&](const std::vector<uint16_t>& ports) {
    TransportContext ctx(1);
    auto stranger = GenerateKeyPair().value();
    for (uint16_t port : ports) {
      const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
      // No CURVE at all: the handshake cannot complete.
      zmq::socket_t plaintext(ctx, zmq::socket_type::dealer);
      plaintext.set(zmq::sockopt::linger, 0);
      plaintext.connect(endpoint);
      answered.push_back(AnsweredWithin(plaintext, 300));
      // CURVE with the right server key but a key pair of its own: refused by ZAP.
      zmq::socket_t wrong_key(ctx, zmq::socket_type::dealer);
      wrong_key.set(zmq::sockopt::linger, 0);
      wrong_key.set(zmq::sockopt::curve_serverkey, sec->server.public_key);
      wrong_key.set(zmq::sockopt::curve_publickey, stranger.public_key);
      wrong_key.set(zmq::sockopt::curve_secretkey, stranger.secret_key);
      wrong_key.connect(endpoint);
      answered.push_back(AnsweredWithin(wrong_key, 300));
      // The cluster's client key: this one is let in (and told it is no registered worker).
      zmq::socket_t member(ctx, zmq::socket_type::dealer);
      member.set(zmq::sockopt::linger, 0);
      member.set(zmq::sockopt::curve_serverkey, sec->server.public_key);
      member.set(zmq::sockopt::curve_publickey, sec->client.public_key);
      member.set(zmq::sockopt::curve_secretkey, sec->client.secret_key);
      member.connect(endpoint);
      answered.push_back(AnsweredWithin(member, 2000));
    }
  };
  PsJobResult curve = RunPsJob(o, data, data);
  ASSERT_TRUE(curve.status.ok()) << curve.status;
  EXPECT_EQ(curve.params, plain.params);  // CURVE changes nothing but the bytes on the wire
  ASSERT_EQ(answered.size(), 6u);
  for (size_t i = 0; i < answered.size(); ++i) EXPECT_EQ(answered[i], i % 3 == 2) << "probe " << i;
  EXPECT_GE(curve.auth_refused, 2);  // one stranger per shard
  int64_t rejected = 0;
  for (const auto& st : curve.server_stats) rejected += st.requests.rejected;
  EXPECT_EQ(rejected, 2);  // only the members' probes reached a shard (and were refused there)
  for (const auto& st : curve.server_stats) {
    EXPECT_EQ(st.channels.data_channels, 0) << "values left CURVE's encryption";
    EXPECT_EQ(st.channels.data_pulls, 0);
  }
}

TEST(AuthTest, AFloodOfGarbageDoesNotChangeTraining) {
  Dataset data;
  PsJobOptions o = Job(&data);
  PsJobResult quiet = RunPsJob(o, data, data);
  ASSERT_TRUE(quiet.status.ok()) << quiet.status;
  int sent = 0;
  o.side_task = [&](const std::vector<uint16_t>& ports) {
    TransportContext ctx(1);
    Rng rng(9);
    std::vector<zmq::socket_t> socks;
    for (uint16_t port : ports) {
      socks.emplace_back(ctx, zmq::socket_type::dealer);
      socks.back().set(zmq::sockopt::linger, 0);
      socks.back().set(zmq::sockopt::rcvhwm, 10);
      socks.back().connect("tcp://127.0.0.1:" + std::to_string(port));
    }
    // 5,000 messages per shard, at most 2 s: random frames, and well-formed headers that lie
    // (a worker rank that does not exist, pushes whose sizes do not match, unknown types).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (int i = 0; i < 5000 && std::chrono::steady_clock::now() < deadline; ++i) {
      for (auto& s : socks) {
        std::vector<std::string> frames;
        if (i % 3 == 0) {
          wire::Header h;
          h.set_type(static_cast<wire::Type>(rng.UniformInt(25)));
          h.set_sender_role(wire::WORKER);
          // Ranks the job does not have (-1, 2..5). Without --auth-dir a peer that claims a real
          // worker's rank before that worker's first request could speak for it: that is the
          // threat model's "anyone can push" (docs/security.md), not garbage.
          const int32_t fake = static_cast<int32_t>(rng.UniformInt(5));
          h.set_sender_rank(fake == 0 ? -1 : fake + 1);
          h.mutable_ps()->set_clock(static_cast<int64_t>(rng.UniformInt(1000)) - 10);
          h.set_has_values(rng.UniformInt(2) == 1);
          h.set_num_keys(rng.UniformInt(3));
          auto* seg = h.add_segments();
          seg->set_offset(rng.UniformInt(400));
          seg->set_length(rng.UniformInt(400));
          frames.push_back(h.SerializeAsString());
        }
        const int extra = static_cast<int>(rng.UniformInt(3)) + (frames.empty() ? 1 : 0);
        for (int f = 0; f < extra; ++f) {
          std::string bytes(static_cast<size_t>(rng.UniformInt(64)), '\0');
          for (char& c : bytes) c = static_cast<char>(rng.UniformInt(256));
          frames.push_back(bytes);
        }
        for (size_t f = 0; f < frames.size(); ++f) {
          (void)s.send(zmq::buffer(frames[f]), f + 1 < frames.size() ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                                                     : zmq::send_flags::dontwait);
        }
        ++sent;
        zmq::message_t reply;  // drain the error replies now and then
        while (s.recv(reply, zmq::recv_flags::dontwait)) {
        }
      }
    }
  };
  PsJobResult flooded = RunPsJob(o, data, data);
  ASSERT_TRUE(flooded.status.ok()) << flooded.status;
  EXPECT_EQ(flooded.params, quiet.params);  // not one applied update changed
  int64_t refused = 0;
  for (const auto& st : flooded.server_stats) refused += st.requests.rejected + st.requests.malformed;
  RecordProperty("garbage_sent", std::to_string(sent));
  RecordProperty("garbage_refused", std::to_string(refused));
  EXPECT_GT(sent, 1000);
  EXPECT_GT(refused, sent / 2);
}

}  // namespace
}  // namespace gradsync::testing
