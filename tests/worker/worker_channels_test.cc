// The worker's side of the value channels (worker/channels/): a lane's push waits until the shard
// has let go of the previous one (handling replies meanwhile) and a pull never overlaps one in
// flight; the router attaches lanes to the shards on this host only, hands a request the shard's
// channel only where it may take it, and keeps counting a dropped channel's bytes. The shard is
// played by the test: it maps the lane the way a server does.
#include "worker/channels/worker_channels.h"

#include <gtest/gtest.h>

#include <numeric>
#include <optional>
#include <vector>

#include "common/net/shm_lane.h"
#include "worker/channels/worker_lane.h"

namespace gradsync {
namespace {

PsReply Attached(const PsRequest& r) {
  PsReply reply = ReplyTo(r, wire::CHANNEL_ATTACH_REPLY, 0);
  reply.at.channel = r.at.channel;
  return reply;
}

TEST(WorkerLaneTest, APushWaitsForTheShardAndPullsNeverOverlap) {
  const Segment range{100, 1100};
  std::optional<ShmLane> shard;
  auto ask = [&](PsRequest r, double) -> Result<PsReply> {
    EXPECT_EQ(r.type, wire::CHANNEL_ATTACH);
    EXPECT_EQ(r.at.channel, wire::CHANNEL_LANE);
    EXPECT_EQ(r.segments, std::vector<Segment>{range});
    ASSIGN_OR_RETURN(ShmLane mapped, ShmLane::Attach(r.at.attach, range.size()));
    shard = std::move(mapped);
    return Attached(r);
  };
  auto lane = WorkerLane::Attach(range, ask, 5);
  ASSERT_TRUE(lane.ok()) << lane.status();
  ASSERT_TRUE(shard.has_value());
  WorkerChannel& c = **lane;
  EXPECT_EQ(c.kind(), wire::CHANNEL_LANE);

  std::vector<float> grads(1200);
  std::iota(grads.begin(), grads.end(), 0.0f);
  const std::vector<Segment> runs = {{100, 600}, {600, 1100}};
  EXPECT_TRUE(c.TakesPush(runs, -1));
  EXPECT_FALSE(c.TakesPush(std::vector<Segment>{{100, 200}, {300, 400}}, -1)) << "a push's segments are contiguous";
  int progress = 0;
  auto fail_third = [&]() -> Status { return ++progress < 3 ? OkStatus() : UnavailableError("the shard is dead"); };
  ASSERT_TRUE(c.OpenPush(WaitPolicy{}, fail_third).ok());
  EXPECT_EQ(progress, 0) << "the push area was free";
  ValueRef at;
  Payload payload;
  ASSERT_TRUE(c.SendPush(PushSource{.runs = runs, .grads = grads}, &at, &payload).ok());
  EXPECT_EQ(at.channel, wire::CHANNEL_LANE);
  EXPECT_EQ(at.seq, 1u);
  EXPECT_EQ(shard->push_area()[0], 100.0f);
  EXPECT_EQ(shard->push_area()[999], 1099.0f);
  // The shard still reads push 1: the next one waits, handling replies, and ends with their error.
  Status held = c.OpenPush(WaitPolicy{}, fail_third);
  EXPECT_EQ(held.code(), StatusCode::kUnavailable) << held;
  EXPECT_EQ(progress, 3);
  shard->Consume(1);
  ASSERT_TRUE(c.OpenPush(WaitPolicy{}, fail_third).ok());
  ASSERT_TRUE(c.SendPush(PushSource{.runs = runs, .grads = grads}, &at, &payload).ok());
  EXPECT_EQ(at.seq, 2u);

  c.SendPull(7, std::vector<Segment>{{100, 200}}, &at);
  EXPECT_EQ(at.channel, wire::CHANNEL_LANE);
  EXPECT_FALSE(c.TakesPull(std::vector<Segment>{{150, 160}}, -1)) << "its answer would overwrite request 7's";
  EXPECT_TRUE(c.TakesPull(std::vector<Segment>{{200, 300}}, -1));
  shard->pull_area()[0] = 5.0f;
  shard->pull_area()[3] = 8.0f;
  PsReply reply;
  reply.type = wire::PULL_REPLY;
  reply.at.channel = wire::CHANNEL_LANE;
  reply.segments = {{100, 104}};
  std::vector<float> params(1200, 0.0f);
  Status broke;
  ASSERT_TRUE(c.ReadPull(Message(), reply, params.data(), &broke).ok() && broke.ok());
  EXPECT_EQ(params[100], 5.0f);
  EXPECT_EQ(params[103], 8.0f);
  c.Forget(7);
  EXPECT_TRUE(c.TakesPull(std::vector<Segment>{{150, 160}}, -1));
  EXPECT_EQ(c.bytes().pushed, 2u * 1000 * sizeof(float));
  EXPECT_EQ(c.bytes().pulled, 4u * sizeof(float));
  EXPECT_EQ(c.bytes().wire_sent, 0u) << "a lane puts nothing on a wire";

  // A shard that refuses the lane: no channel, its reason.
  auto refused = WorkerLane::Attach(range, [](PsRequest, double) -> Result<PsReply> {
    return PermissionDeniedError("another user's lane");
  }, 5);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
}

TEST(WorkerChannelsTest, LanesGoToShardsOnThisHostAndADroppedOnesBytesStillCount) {
  wire::ClusterTable table;
  for (const char* host : {"127.0.0.1", "192.0.2.7"}) {  // this host, and another (never contacted)
    auto* s = table.add_servers();
    s->set_host(host);
    s->set_port(5000);
    s->set_rank(table.servers_size() - 1);
  }
  auto* w = table.add_workers();
  w->set_rank(0);
  w->set_host("198.51.100.1");
  const Partitioner partitioner(2000, 2);
  std::vector<ShmLane> shards;
  int asked = 0;
  Status answer = OkStatus();
  WorkerChannels channels(0, table, partitioner, [&](int s, PsRequest r, double) -> Result<PsReply> {
    ++asked;
    EXPECT_EQ(s, 0) << "a lane to another host's shard";
    RETURN_IF_ERROR(answer);
    ASSIGN_OR_RETURN(ShmLane mapped, ShmLane::Attach(r.at.attach, partitioner.range(s).size()));
    shards.push_back(std::move(mapped));
    return Attached(r);
  });
  auto lanes = channels.AttachLanes(5);
  ASSERT_TRUE(lanes.ok()) << lanes.status();
  EXPECT_EQ(*lanes, 1);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(channels.count(wire::CHANNEL_LANE), 1);
  EXPECT_EQ(channels.count(wire::CHANNEL_DATA), 0);
  ASSERT_NE(channels.Of(0, wire::CHANNEL_LANE), nullptr);
  EXPECT_EQ(channels.Of(0, wire::CHANNEL_DATA), nullptr);
  EXPECT_EQ(channels.Of(1, wire::CHANNEL_LANE), nullptr);
  const std::vector<Segment> first = {{0, 1000}};
  std::vector<float> grads(2000, 1.0f);
  const std::vector<Segment> second = {{1000, 2000}};
  // ZeroMQ's own channel is every shard's; ForPush gives it where no channel beside it takes the push.
  EXPECT_EQ(channels.ForPush(1, PushSource{.runs = second, .grads = grads}, -1, true).kind(), wire::CHANNEL_ZMQ)
      << "shard 1 has no channel";
  WorkerChannel& lane = channels.ForPush(0, PushSource{.runs = first, .grads = grads}, -1, true);
  ASSERT_EQ(lane.kind(), wire::CHANNEL_LANE);
  ValueRef at;
  Payload payload;
  ASSERT_TRUE(lane.OpenPush(WaitPolicy{}, [] { return OkStatus(); }).ok());
  ASSERT_TRUE(lane.SendPush(PushSource{.runs = first, .grads = grads}, &at, &payload).ok());
  EXPECT_EQ(channels.bytes(wire::CHANNEL_LANE).pushed, 4000u);

  channels.Drop(0, DataLossError("broken"));
  EXPECT_EQ(channels.count(wire::CHANNEL_LANE), 0);
  EXPECT_EQ(channels.ForPush(0, PushSource{.runs = first, .grads = grads}, -1, true).kind(), wire::CHANNEL_ZMQ)
      << "a dropped channel: ZeroMQ";
  EXPECT_EQ(channels.bytes(wire::CHANNEL_LANE).pushed, 4000u) << "a dropped channel's bytes still count";

  // Reconnected: a lane again where the shard takes one, none where it refuses (a warning).
  channels.Reattach(std::vector<int>{0}, [] { return 5.0; }, false);
  EXPECT_EQ(channels.count(wire::CHANNEL_LANE), 1);
  answer = PermissionDeniedError("no room");
  channels.Reattach(std::vector<int>{0}, [] { return 5.0; }, false);
  EXPECT_EQ(channels.count(wire::CHANNEL_LANE), 0);
  // Attaching anew: a refusal goes on without, a deadline ends it (the job would fail the same way).
  auto refused = channels.AttachLanes(5);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(*refused, 0);
  answer = DeadlineExceededError("no reply from server 0");
  EXPECT_EQ(channels.AttachLanes(5).status().code(), StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace gradsync
