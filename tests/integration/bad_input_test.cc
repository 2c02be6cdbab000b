// A raw ZeroMQ peer feeds a server shard malformed and hostile messages while a real worker
// trains: every one is answered with an error, the server keeps serving, and the parameters
// afterwards are bit-identical to a clean run's.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <cstring>
#include <thread>

#include "common/data/synthetic.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/net/data_channel.h"
#include "common/net/shm_lane.h"
#include "common/ps/ps_protocol.h"
#include "server/scheduler/scheduler.h"
#include "server/server.h"
#include "tests/support/wire_request.h"
#include "worker/job_trainer.h"
#include "worker/ps/client/ps_client.h"

namespace gradsync {
namespace {

struct Outcome {
  std::vector<float> params;
  ServerStats stats;
  int errors_answered = 0;
  int sent = 0;    // messages that must be answered (with an error)
  int silent = 0;  // the rest of a push in parts whose error was already the answer
  std::vector<std::string> error_messages;
};

zmq::message_t Bytes(const std::string& s) { return zmq::message_t(s.data(), s.size()); }

wire::Header Push(int rank, int64_t clock, int64_t version, uint64_t offset, uint64_t length) {
  wire::Header h = testing::WorkerRequest(wire::PUSH, rank, clock, offset, length);
  h.mutable_ps()->set_version(version);
  h.set_has_values(true);
  return h;
}

// Sends the hostile messages on a fresh DEALER socket bound to worker 1's rank; counts replies.
void Attack(TransportContext& ctx, uint16_t port, int64_t shard_size, Outcome* out) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect("tcp://127.0.0.1:" + std::to_string(port));
  uint64_t id = 100;
  auto send = [&](wire::Header h, std::vector<zmq::message_t> extra) {
    h.set_request_id(++id);
    std::string bytes;
    h.SerializeToString(&bytes);
    s.send(Bytes(bytes), extra.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
    for (size_t i = 0; i < extra.size(); ++i) {
      s.send(extra[i], i + 1 < extra.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    out->sent++;
  };
  std::vector<float> values(static_cast<size_t>(shard_size), 1.0f);
  auto vals = [&](size_t n) { return zmq::message_t(values.data(), n * sizeof(float)); };

  // A valid pull first: it binds this connection to worker 1 (as a real worker's first request).
  const wire::Header pull = testing::WorkerRequest(wire::PULL, 1, 0, 0, static_cast<uint64_t>(shard_size));
  send(pull, {});
  out->sent--;  // not an attack

  // 1. Garbage bytes as a header.
  s.send(Bytes(std::string("\xff\x13garbage\x00\x01not a protobuf", 24)), zmq::send_flags::none);
  out->sent++;
  // 2. Truncated: the header announces values, no values frame follows.
  send(Push(1, 0, 0, 0, 4), {});
  // 3. Wrong length: 4 values announced, 3 sent.
  { std::vector<zmq::message_t> f; f.push_back(vals(3)); send(Push(1, 0, 0, 0, 4), std::move(f)); }
  // 4. An unknown tensor / a range this shard does not own.
  { std::vector<zmq::message_t> f; f.push_back(vals(4)); send(Push(1, 0, 0, static_cast<uint64_t>(shard_size) + 1000, 4), std::move(f)); }
  // 5. An unregistered sender.
  { std::vector<zmq::message_t> f; f.push_back(vals(4)); send(Push(99, 0, 0, 0, 4), std::move(f)); }
  // 6. Another connection speaking for worker 0.
  { std::vector<zmq::message_t> f; f.push_back(vals(4)); send(Push(0, 0, 0, 0, 4), std::move(f)); }
  // 7. An old clock and 8. a future clock.
  { std::vector<zmq::message_t> f; f.push_back(vals(4)); send(Push(1, -1, 0, 0, 4), std::move(f)); }
  { std::vector<zmq::message_t> f; f.push_back(vals(4)); send(Push(1, 7, 0, 0, 4), std::move(f)); }
  // 9. A gradient computed on a version the shard has not reached.
  { std::vector<zmq::message_t> f; f.push_back(vals(4)); send(Push(1, 0, 1LL << 40, 0, 4), std::move(f)); }
  // 10. Keys frame that does not match num_keys.
  {
    wire::Header h = Push(1, 0, 0, 0, 0);
    h.set_num_keys(3);
    std::vector<zmq::message_t> f;
    f.push_back(zmq::message_t(16));
    f.push_back(vals(3));
    send(h, std::move(f));
  }
  // 11. An absurd segment length.
  { std::vector<zmq::message_t> f; f.push_back(vals(4)); send(Push(1, 0, 0, 0, 1ULL << 50), std::move(f)); }
  // 12. A message type servers do not take.
  { wire::Header h; h.set_type(wire::BARRIER); h.set_sender_role(wire::WORKER); h.set_sender_rank(1); send(h, {}); }

  // 13. A compressed push in a job that compresses nothing.
  {
    wire::Header h = Push(1, 0, 0, 0, 4);
    h.set_codec("fp16");
    std::vector<zmq::message_t> f;
    f.push_back(zmq::message_t(8));
    send(h, std::move(f));
  }

  // 14. A pull asking for compressed deltas in a job that does not compress pulls.
  {
    wire::Header h = pull;
    h.set_codec("topk:0.01");
    send(h, {});
  }

  // 15. (fuzz_message) A pull whose segment offset + length overflows int64: it must not wrap
  //     into the range and read memory before the shard's parameters.
  {
    wire::Header h = pull;
    h.mutable_segments(0)->set_offset((1ULL << 63) - 8);
    h.mutable_segments(0)->set_length(16);
    send(h, {});
  }
  // 16. (fuzz_message) num_keys so large that num_keys * 8 wraps to the keys frame's 8 bytes.
  {
    wire::Header h = pull;
    h.set_num_keys((1ULL << 61) + 1);
    std::vector<zmq::message_t> f;
    f.push_back(zmq::message_t(8));
    send(h, std::move(f));
  }
  // 17. (fuzz_message) The whole range asked for 4 times: a small header that would size a
  //     reply four times the shard.
  {
    wire::Header h = pull;
    for (int i = 0; i < 3; ++i) *h.add_segments() = h.segments(0);
    send(h, {});
  }

  // 18. A push whose learning rate is negative, and 19. a pull that carries one.
  {
    wire::Header h = Push(1, 0, 0, 0, 4);
    h.mutable_ps()->set_lr(-0.5f);
    std::vector<zmq::message_t> f;
    f.push_back(vals(4));
    send(h, std::move(f));
  }
  {
    wire::Header h = pull;
    h.mutable_ps()->set_lr(0.1f);
    send(h, {});
  }

  // Overlapped pushes (PsFields.parts): one answer per push, the error at its first bad part.
  auto send_part = [&](int64_t clock, int index, int parts, uint64_t offset, bool answered) {
    wire::Header h = Push(1, clock, 0, offset, 4);
    h.mutable_ps()->set_parts(parts);
    h.mutable_ps()->set_part(index);
    std::vector<zmq::message_t> f;
    f.push_back(vals(4));
    send(h, std::move(f));
    if (!answered) {
      out->sent--;
      out->silent++;
    }
  };
  // 20. Part 1 of 3 without part 0, and 21. the rest of that push (dropped without a reply).
  send_part(0, 1, 3, 0, true);
  send_part(0, 2, 3, 4, false);
  // 22. More parts than a push may have.
  send_part(0, 0, 100000, 0, true);
  // 23. Part 1 repeats elements of part 0 (which is held, unanswered), and 24. part 1 again.
  send_part(0, 0, 2, 0, false);
  send_part(0, 1, 2, 2, true);
  send_part(0, 1, 2, 8, false);

  // Shared-memory lanes (common/net/shm_lane.h). The real worker 0 pushes and pulls through its own
  // lane meanwhile.
  auto shm_push = [&](uint64_t offset, uint64_t length) {
    wire::Header h = testing::WorkerRequest(wire::PUSH, 1, 0, offset, length);
    h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_LANE);
    h.mutable_ps()->mutable_values_at()->set_seq(1);
    return h;
  };
  auto attach = [&](const std::string& name) {
    wire::Header h = testing::WorkerRequest(wire::CHANNEL_ATTACH, 1, 0, 0, static_cast<uint64_t>(shard_size));
    h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_LANE);
    h.mutable_ps()->mutable_values_at()->set_attach(name);
    return h;
  };
  // 25. A shm push, and 26. a shm pull, before worker 1 attached a lane.
  send(shm_push(0, 4), {});
  { wire::Header h = pull; h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_LANE); send(h, {}); }
  // 27. A lane name that is a path, 28. a lane that does not exist, 29. a lane of the wrong size.
  send(attach("/../../dev/shm/x"), {});
  send(attach("/gradsync-00000000000000000000000000000000.1.3"), {});
  auto wrong_size = ShmLane::Create(shard_size + 1);
  ASSERT_TRUE(wrong_size.ok()) << wrong_size.status();
  send(attach(wrong_size->name()), {});
  wrong_size->Unpublish();
  // 30. A lane named on a JOIN.
  { wire::Header h = testing::WorkerRequest(wire::JOIN, 1, 0, 0, 0); h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_LANE); send(h, {}); }
  // A real lane for worker 1 (answered with CHANNEL_ATTACH_REPLY, not an attack).
  auto lane = ShmLane::Create(shard_size);
  ASSERT_TRUE(lane.ok()) << lane.status();
  send(attach(lane->name()), {});
  out->sent--;
  // 31. A shm push that also carries a values frame, 32. one without its number, 33. one whose
  //     segments are not contiguous, 34. one outside the range, 35. one with keys.
  { std::vector<zmq::message_t> f; f.push_back(vals(4)); wire::Header h = shm_push(0, 4); h.set_has_values(true); send(h, std::move(f)); }
  { wire::Header h = shm_push(0, 4); h.mutable_ps()->mutable_values_at()->clear_seq(); send(h, {}); }
  {
    wire::Header h = shm_push(0, 4);
    auto* seg = h.add_segments();
    seg->set_offset(8);
    seg->set_length(4);
    send(h, {});
  }
  send(shm_push(static_cast<uint64_t>(shard_size) - 2, 4), {});
  {
    wire::Header h = shm_push(0, 0);
    h.set_num_keys(1);
    std::vector<zmq::message_t> f;
    uint64_t key = 0;
    f.push_back(zmq::message_t(&key, sizeof(key)));
    send(h, std::move(f));
  }

  // Replies: two pull answers, two CHANNEL_ATTACH_REPLYs (a lane, a data channel) and one ERROR per
  // answered attack.
  const int answers = 4;
  int replies = 0;
  int data_port = 0;
  auto take_reply = [&](int timeout_ms) {
    zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) == 0) return false;
    std::vector<zmq::message_t> parts;
    zmq::message_t part;
    do {
      (void)s.recv(part);
      parts.push_back(std::move(part));
    } while (s.get(zmq::sockopt::rcvmore));
    wire::Header h;
    EXPECT_TRUE(h.ParseFromArray(parts[0].data(), static_cast<int>(parts[0].size())));
    ++replies;
    if (h.type() == wire::ERROR) {
      out->errors_answered++;
      out->error_messages.push_back(h.error_message());
    }
    if (h.type() == wire::CHANNEL_ATTACH_REPLY && h.ps().values_at().channel() == wire::CHANNEL_DATA) {
      data_port = static_cast<int>(h.ps().values_at().port());
    }
    return true;
  };

  // The data channel (common/net/data_channel.h).
  auto data_push = [&](uint64_t offset, uint64_t length, uint64_t seq) {
    wire::Header h = testing::WorkerRequest(wire::PUSH, 1, 0, offset, length);
    h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_DATA);
    h.mutable_ps()->mutable_values_at()->set_seq(seq);
    return h;
  };
  auto data_attach = [&](const std::string& token) {
    wire::Header h = testing::WorkerRequest(wire::CHANNEL_ATTACH, 1, 0, 0, static_cast<uint64_t>(shard_size));
    h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_DATA);
    h.mutable_ps()->mutable_values_at()->set_attach(token);
    return h;
  };
  // 36. A data push before worker 1 has a data channel. (A data pull then is answered over
  //     ZeroMQ, as one whose channel went: not an attack.)
  send(data_push(0, 4, 1), {});
  { wire::Header h = pull; h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_DATA); send(h, {}); }
  out->sent--;
  // 37. A token of the wrong size, 38. a data channel named on a JOIN, 39. a push through a
  //     channel this build does not know.
  send(data_attach("short"), {});
  { wire::Header h = testing::WorkerRequest(wire::JOIN, 1, 0, 0, 0); h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_DATA); send(h, {}); }
  { wire::Header h = data_push(0, 4, 1); h.mutable_ps()->mutable_values_at()->set_channel(static_cast<wire::Channel>(7)); send(h, {}); }
  // A real channel for worker 1 (answered with CHANNEL_ATTACH_REPLY, not an attack).
  const std::string token(kDataTokenBytes, 'k');
  send(data_attach(token), {});
  out->sent--;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       data_port == 0 && std::chrono::steady_clock::now() < until;) {
    take_reply(50);
  }
  ASSERT_GT(data_port, 0) << "no CHANNEL_ATTACH_REPLY for the data channel";
  // A connection presenting another token is closed without a word (and takes no slot).
  {
    auto stranger = DataStream::Connect("127.0.0.1", data_port, 5);
    ASSERT_TRUE(stranger.ok()) << stranger.status();
    const std::string wrong(kDataTokenBytes, 'x');
    ASSERT_TRUE(stranger->Write(std::vector<iovec>{{const_cast<char*>(wrong.data()), wrong.size()}}, 5).ok());
    char ack[kDataAckBytes];
    Status st = stranger->Read(ack, sizeof(ack), 10);
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << "a wrong token must be refused: " << st;
  }
  auto channel = DataStream::Connect("127.0.0.1", data_port, 5);
  ASSERT_TRUE(channel.ok()) << channel.status();
  ASSERT_TRUE(channel->Write(std::vector<iovec>{{const_cast<char*>(token.data()), token.size()}}, 5).ok());
  {
    char ack[kDataAckBytes];
    ASSERT_TRUE(channel->Read(ack, sizeof(ack), 10).ok());
    ASSERT_EQ(0, std::memcmp(ack, kDataAck, kDataAckBytes));
  }
  auto frame = [&](uint64_t seq, size_t n) {
    std::vector<std::span<const float>> v = {std::span<const float>(values.data(), n)};
    ASSERT_TRUE(channel->WriteFrame(seq, v, 5).ok());
  };
  // 40. A push naming 6 values over a frame of 4, 41. a push naming a frame already dropped,
  //     42. a data push with keys, 43. a push whose frame never comes (the shard waits
  //     data_wait_s, then refuses it).
  frame(1, 4);
  send(data_push(0, 6, 1), {});
  frame(2, 4);
  send(data_push(0, 4, 1), {});
  {
    wire::Header h = data_push(0, 0, 2);
    h.set_num_keys(1);
    std::vector<zmq::message_t> f;
    uint64_t key = 0;
    f.push_back(zmq::message_t(&key, sizeof(key)));
    send(h, std::move(f));
  }
  send(data_push(0, 4, 3), {});
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       replies < out->sent + answers && std::chrono::steady_clock::now() < until;) {
    take_reply(50);
  }
  // 44. A frame larger than the range breaks the connection; a push after it is refused.
  {
    const uint64_t head[2] = {3, (static_cast<uint64_t>(shard_size) + 1) * sizeof(float)};
    ASSERT_TRUE(channel->Write(std::vector<iovec>{{const_cast<uint64_t*>(head), sizeof(head)}}, 5).ok());
    char byte;
    EXPECT_EQ(channel->Read(&byte, 1, 10).code(), StatusCode::kUnavailable) << "the shard must close it";
  }
  send(data_push(0, 4, 3), {});

  // Replication (server/replication.h): this job has no backups. 45. A snapshot of the server's
  // own shard, as its primary would send it (with a key), 46. an entry for a shard that does
  // not exist. (A backup's refusals: FaultTest.AStrangersReplicationEntriesAreRefused...)
  auto replicate = [&](int shard, wire::ReplicaOp op) {
    wire::Header h = testing::ReplicateEntry(shard, op, 0);
    h.mutable_replica()->set_key("0123456789abcdef");
    return h;
  };
  send(replicate(0, wire::REPLICA_META), {});
  send(replicate(7, wire::REPLICA_PUSH), {});

  // Every reply, then a little longer, so that a reply to a message that must go unanswered is seen.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool all_in = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (replies >= out->sent + answers && !all_in) {
      all_in = true;
      deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    }
    take_reply(50);
  }
}

Outcome RunJob(bool attack) {
  Outcome out;
  BlobsOptions bo;
  bo.n = 640;
  bo.dim = 10;
  bo.classes = 3;
  Dataset data = MakeGaussianBlobs(bo);
  ModelOptions mo;
  mo.name = "mlp";
  mo.input_dim = 10;
  mo.num_classes = 3;
  mo.hidden = {8};
  TransportContext ctx(2);
  SchedulerOptions so;
  so.num_servers = 1;
  so.num_workers = 2;
  so.heartbeat_timeout_s = 5;
  auto sched = std::move(Scheduler::Create(ctx, so)).value();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(sched->port());
  ServerOptions sv;
  sv.link.scheduler_endpoint = endpoint;
  sv.rule.mode = ConsistencyMode::kAsp;
  sv.link.heartbeat_interval_s = 0.2;
  sv.channels.data_wait_s = 1;
  auto server = std::move(Server::Create(ctx, sv)).value();
  std::thread st([&] { EXPECT_TRUE(sched->Run().ok()); });
  std::thread sv_thread([&] { EXPECT_TRUE(server->Run().ok()); });

  auto client_options = [&](int rank) {
    SchedulerClientOptions c;
    c.scheduler_endpoint = endpoint;
    c.self.set_role(wire::WORKER);
    c.self.set_host("127.0.0.1");
    c.self.set_requested_rank(rank);
    c.mode = "asp";
    c.heartbeat_interval_s = 0.2;
    return c;
  };
  auto model = std::move(CreateModel(mo)).value();
  model->Initialize(0);
  std::thread real([&] {
    SchedulerClient sc(ctx, client_options(0));
    auto table = sc.Register(20);
    ASSERT_TRUE(table.ok()) << table.status();
    auto ps = std::move(PsClient::Create(ctx, *table, 0, model->layout(), &sc)).value();
    PsTrainOptions o;
    o.train.batch = 16;
    o.train.epochs = 4;
    o.train.optimizer.momentum = 0.9f;
    o.train.lr = {LrSchedule::Kind::kCosine, 0.05f, 0, 0};
    o.num_workers = 2;
    o.evaluate = false;
    // Slow the real worker a little so that the attack lands in the middle of training.
    o.loop.before_compute = [](int64_t) { std::this_thread::sleep_for(std::chrono::microseconds(300)); };
    PsTrainer t(o, model.get(), &data, &data, nullptr, ps.get(), &sc);
    auto r = t.Run();
    EXPECT_TRUE(r.ok()) << r.status();
    sc.Finished(OkStatus());
    sc.Flush(1);
  });
  // Worker 1 is the test: it registers, passes the barriers, and (maybe) attacks in between.
  SchedulerClient sc(ctx, client_options(1));
  auto table = sc.Register(20);
  EXPECT_TRUE(table.ok()) << table.status();
  EXPECT_TRUE(sc.Barrier("init", "workers", 20).ok());
  if (attack) Attack(ctx, server->port(), model->num_params(), &out);
  EXPECT_TRUE(sc.Barrier("trained", "workers", 60).ok());
  sc.Finished(OkStatus());
  sc.Flush(1);
  real.join();
  sv_thread.join();
  st.join();
  out.params = server->params();
  out.stats = server->stats();
  return out;
}

TEST(BadInputTest, HostileMessagesAreAnsweredAndChangeNothing) {
  Outcome clean = RunJob(false);
  Outcome attacked = RunJob(true);
  EXPECT_EQ(attacked.sent, 44);
  EXPECT_EQ(attacked.silent, 3);
  EXPECT_EQ(attacked.errors_answered, attacked.sent);
  for (const auto& m : attacked.error_messages) EXPECT_EQ(m.rfind("server 0: ", 0), 0u) << m;
  EXPECT_EQ(attacked.stats.requests.rejected, attacked.sent);
  EXPECT_GE(attacked.stats.requests.malformed, 6);  // garbage, truncated, wrong length, keys mismatch, overflows
  EXPECT_EQ(clean.stats.requests.rejected, 0);
  // The real worker's values went through its lane in both runs (the attacker's lane was refused
  // or given no valid push).
  EXPECT_GT(clean.stats.channels.shm_pulls, 0);
  EXPECT_GT(attacked.stats.channels.shm_pulls, 0);
  EXPECT_EQ(attacked.stats.requests.pushes, clean.stats.requests.pushes);
  ASSERT_EQ(clean.params.size(), attacked.params.size());
  EXPECT_EQ(0, std::memcmp(clean.params.data(), attacked.params.data(), clean.params.size() * sizeof(float)))
      << "an attack changed the parameters";
}

}  // namespace
}  // namespace gradsync
