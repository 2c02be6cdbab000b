// The replication plane's one encoder and decoder (common/ps/replica_protocol.h): an
// entry and an answer come back as they were sent, and what a header alone can say is wrong is
// refused.
#include "common/ps/replica_protocol.h"

#include <gtest/gtest.h>

#include <cmath>

namespace gradsync {
namespace {

ReplicaEntry Push() {
  ReplicaEntry e;
  e.sender = 1;
  e.shard = 1;
  e.op = wire::REPLICA_PUSH;
  e.seq = 41;
  e.index = 7;
  e.worker = 2;
  e.push.scale = 0.5f;
  e.push.counts = true;
  e.push.lr = 0.125f;
  e.push.absent = {3};
  e.frames.segments = {{100, 164}, {200, 204}};
  e.control = ReplicaControl{{4, 5, 5}, {true, false, true}, 9};
  return e;
}

TEST(ReplicaProtocolTest, AnEntryRoundTrips) {
  const ReplicaEntry e = Push();
  auto back = DecodeReplicaEntry(EncodeReplicaEntry(e));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sender, 1);
  EXPECT_EQ(back->shard, 1);
  EXPECT_EQ(back->op, wire::REPLICA_PUSH);
  EXPECT_EQ(back->seq, 41u);
  EXPECT_EQ(back->index, 7u);
  EXPECT_EQ(back->worker, 2);
  EXPECT_EQ(back->push.scale, 0.5f);
  EXPECT_TRUE(back->push.counts);
  EXPECT_EQ(back->push.lr, 0.125f);
  EXPECT_EQ(back->push.absent, e.push.absent);
  EXPECT_EQ(back->frames.segments, e.frames.segments);
  ASSERT_TRUE(back->control.has_value());
  EXPECT_EQ(back->control->pushed, e.control->pushed);
  EXPECT_EQ(back->control->live, e.control->live);
  EXPECT_EQ(back->control->rounds, 9);

  ReplicaEntry state;
  state.op = wire::REPLICA_OPTIMIZER;
  state.worker = 0;
  state.state.part = 1;
  state.state.optimizer = "adam";
  state.state.steps = 12;
  state.state.skipped = {0, 3};
  state.state.slots = 2;
  auto s = DecodeReplicaEntry(EncodeReplicaEntry(state));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->state.optimizer, "adam");
  EXPECT_EQ(s->state.steps, 12);
  EXPECT_EQ(s->state.skipped, state.state.skipped);
  EXPECT_EQ(s->state.slots, 2);
  EXPECT_EQ(s->state.part, 1);
  EXPECT_FALSE(s->control.has_value()) << "no consistency state sent, none read";
  EXPECT_TRUE(std::isnan(s->push.lr));
  EXPECT_FALSE(s->state.params);

  // A parameter set: one OPTIMIZER entry without state fields.
  ReplicaEntry params;
  params.op = wire::REPLICA_OPTIMIZER;
  params.worker = 1;
  params.state.params = true;
  params.frames.segments = {{0, 64}};
  auto p = DecodeReplicaEntry(EncodeReplicaEntry(params));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->state.params);
  EXPECT_EQ(p->worker, 1);
  params.state.slots = 1;
  EXPECT_FALSE(DecodeReplicaEntry(EncodeReplicaEntry(params)).ok()) << "a parameter set with a state vector";
  params.state.slots = 0;
  params.state.part = 1;
  EXPECT_FALSE(DecodeReplicaEntry(EncodeReplicaEntry(params)).ok()) << "a parameter set is one entry";
}

TEST(ReplicaProtocolTest, WhatAHeaderAloneSaysIsWrongIsRefused) {
  auto bad = [](auto mutate) {
    wire::Header h = EncodeReplicaEntry(Push());
    mutate(h);
    return DecodeReplicaEntry(h).status().code();
  };
  EXPECT_EQ(bad([](wire::Header&) {}), StatusCode::kOk);
  EXPECT_EQ(bad([](wire::Header& h) { h.set_type(wire::PUSH); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.set_sender_role(wire::WORKER); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_replica()->set_op(wire::REPLICA_OP_UNSPECIFIED); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_replica()->set_op(static_cast<wire::ReplicaOp>(99)); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_replica()->set_op(wire::REPLICA_META); }), StatusCode::kInvalidArgument);  // no description
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_replica()->set_meta("x"); }), StatusCode::kInvalidArgument);  // on a push
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_replica()->set_scale(NAN); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_replica()->set_lr(-1); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_replica()->set_part(-1); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_replica()->mutable_state()->set_slots(3); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_segments(0)->set_length(~uint64_t{0}); }), StatusCode::kInvalidArgument);
}

TEST(ReplicaProtocolTest, AnAnswerIsAnAcknowledgementOrAnError) {
  ReplicaAck ok;
  ok.sender = 2;
  ok.shard = 1;
  ok.seq = 41;
  auto held = DecodeReplicaAck(EncodeReplicaAck(ok));
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_TRUE(held->error.ok());
  EXPECT_EQ(held->seq, 41u);
  EXPECT_EQ(held->shard, 1);
  ReplicaAck refused = ok;
  refused.error = PermissionDeniedError("server 2: this server does not back up shard 1");
  auto no = DecodeReplicaAck(EncodeReplicaAck(refused));
  ASSERT_TRUE(no.ok()) << no.status();
  EXPECT_EQ(no->error.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(no->error.message(), refused.error.message());
  // An ERROR whose code this build does not know (or OK) is still a refusal.
  wire::Header h = EncodeReplicaAck(refused);
  h.set_error_code(0);
  EXPECT_EQ(DecodeReplicaAck(h)->error.code(), StatusCode::kUnknown);
  h.set_type(wire::REPLICATE);
  EXPECT_EQ(DecodeReplicaAck(h).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradsync
