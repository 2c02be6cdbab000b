// The control plane's one encoder and decoder (common/net/control/control_protocol.h): every message a node
// and the scheduler exchange comes back as it was sent, a Status travels whole (a code this build
// does not know reads as kUnknown), and a message of another plane is refused.
#include "common/net/control/control_protocol.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

TEST(ControlProtocolTest, MessagesRoundTrip) {
  ControlMessage reg = Control(wire::REGISTER);
  reg.sender_role = wire::WORKER;
  reg.sender_rank = -1;
  reg.node.set_role(wire::WORKER);
  reg.node.set_host("127.0.0.1");
  reg.node.set_requested_rank(3);
  reg.job.mode = "ssp";
  reg.job.staleness = -1;
  reg.job.fingerprint = std::string("\0\1\2", 3);
  auto r = DecodeControl(EncodeControl(reg));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type, wire::REGISTER);
  EXPECT_EQ(r->sender_role, wire::WORKER);
  EXPECT_EQ(r->sender_rank, -1);
  EXPECT_EQ(r->node.requested_rank(), 3);
  EXPECT_EQ(r->job.mode, "ssp");
  EXPECT_EQ(r->job.staleness, -1);
  EXPECT_EQ(r->job.fingerprint, reg.job.fingerprint);

  ControlMessage release = Control(wire::BARRIER_RELEASE);
  release.barrier.name = "init";
  release.barrier.gathered = {"a", "", "c"};
  auto b = DecodeControl(EncodeControl(release));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->barrier.name, "init");
  EXPECT_EQ(b->barrier.gathered, release.barrier.gathered) << "an empty part keeps its rank's place";
  EXPECT_TRUE(b->status.ok());

  ControlMessage ended = Control(wire::TRAINING_ENDED);
  ended.ended.clock = 0;
  ended.ended.joined = true;
  auto e = DecodeControl(EncodeControl(ended));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->ended.clock, 0);
  EXPECT_TRUE(e->ended.joined);

  ControlMessage beat = Control(wire::HEARTBEAT);
  beat.probe.sent_us = 12.5;
  beat.probe.scheduler_us = 99.0;
  auto h = DecodeControl(EncodeControl(beat));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->probe.sent_us, 12.5);
  EXPECT_EQ(h->probe.scheduler_us, 99.0);

  ControlMessage limit = Control(wire::MESSAGE_LIMIT);
  limit.max_message_bytes = uint64_t{1} << 33;
  EXPECT_EQ(DecodeControl(EncodeControl(limit))->max_message_bytes, uint64_t{1} << 33);
}

TEST(ControlProtocolTest, AStatusTravelsWholeAndAnotherPlaneIsRefused) {
  ControlMessage shutdown = Control(wire::SHUTDOWN);
  EXPECT_TRUE(DecodeControl(EncodeControl(shutdown))->status.ok()) << "an orderly end carries no error";
  shutdown.status = DataLossError("shard 1 is lost");
  auto s = DecodeControl(EncodeControl(shutdown));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s->status.message(), "shard 1 is lost");
  wire::Header unknown = EncodeControl(shutdown);
  unknown.set_error_code(99);
  EXPECT_EQ(DecodeControl(unknown)->status.code(), StatusCode::kUnknown);
  for (wire::Type other : {wire::PUSH, wire::PULL_REPLY, wire::REPLICATE, wire::TYPE_UNSPECIFIED}) {
    wire::Header h;
    h.set_type(other);
    EXPECT_EQ(DecodeControl(h).status().code(), StatusCode::kInvalidArgument) << other;
  }
}

}  // namespace
}  // namespace gradsync
