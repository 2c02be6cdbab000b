#include "common/ps/ps_protocol.h"
#include "common/ps/table_wire.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/net/control/control_protocol.h"
#include "common/ps/replica_protocol.h"

namespace gradsync {
namespace {

// Each plane's messages carry that plane's fields only: every encoder fills its own, and every
// decoder refuses a header with another plane's (a header with none is all defaults).
TEST(PsProtocolTest, AHeaderCarriesOnlyItsOwnPlanesFields) {
  PsRequest push;
  push.type = wire::PUSH;
  push.clock = 4;
  push.segments = {{0, 8}};
  const wire::Header ps = EncodeRequest(push);
  EXPECT_EQ(ps.plane_case(), wire::Header::kPs);
  ControlMessage heartbeat = Control(wire::HEARTBEAT);
  heartbeat.probe.sent_us = 5;
  const wire::Header control = EncodeControl(heartbeat);
  EXPECT_EQ(control.plane_case(), wire::Header::kControl);
  ReplicaEntry round;
  round.op = wire::REPLICA_ROUND;
  const wire::Header replica = EncodeReplicaEntry(round);
  EXPECT_EQ(replica.plane_case(), wire::Header::kReplica);

  wire::Header mixed = ps;
  mixed.mutable_control()->set_clock(4);  // replaces the PS fields: a oneof holds one plane
  auto refused = DecodeRequest(mixed);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("carries the control plane's fields"), std::string::npos) << refused.status();
  wire::Header beat = control;
  *beat.mutable_ps() = ps.ps();
  EXPECT_EQ(DecodeControl(beat).status().code(), StatusCode::kInvalidArgument);
  wire::Header entry = replica;
  *entry.mutable_ps() = ps.ps();
  EXPECT_EQ(DecodeReplicaEntry(entry).status().code(), StatusCode::kInvalidArgument);
  wire::Header reply = EncodeReply(ReplyTo(*DecodeRequest(ps), wire::PUSH_REPLY, 1));
  reply.mutable_replica()->set_shard(1);
  EXPECT_EQ(DecodeReply(reply).status().code(), StatusCode::kInvalidArgument);

  wire::Header bare = ps;
  bare.clear_plane();
  auto defaults = DecodeRequest(bare);
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->clock, 0);
  EXPECT_EQ(defaults->segments, push.segments);
}

// A push reply's version lag travels as an int64 (it was a double, whose conversion was undefined
// for a value no int64 holds: found by fuzz_ps_plane), every value as it was.
TEST(PsProtocolTest, AVersionLagTravelsAsAWholeNumber) {
  PsRequest push;
  push.type = wire::PUSH;
  PsReply r = ReplyTo(push, wire::PUSH_REPLY, 0);
  for (int64_t lag : {int64_t{0}, int64_t{3}, int64_t{-2}, std::numeric_limits<int64_t>::max(),
                      std::numeric_limits<int64_t>::min()}) {
    r.staleness.version_lag = lag;
    auto back = DecodeReply(EncodeReply(r));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->staleness.version_lag, lag);
  }
}

TEST(PsProtocolTest, APushInPartsRoundTrips) {
  PsRequest r;
  r.type = wire::PUSH;
  r.worker = 3;
  r.request_id = 77;
  r.clock = 12;
  r.push.version = 40;
  r.segments = {{100, 164}, {200, 201}};
  r.parts = 5;
  r.part = 2;
  auto back = DecodeRequest(EncodeRequest(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->type, wire::PUSH);
  EXPECT_EQ(back->worker, 3);
  EXPECT_EQ(back->request_id, 77u);
  EXPECT_EQ(back->clock, 12);
  EXPECT_EQ(back->push.version, 40);
  EXPECT_EQ(back->segments, r.segments);
  EXPECT_EQ(back->parts, 5);
  EXPECT_EQ(back->part, 2);
  EXPECT_EQ(TotalSize(back->segments), 65u);
}

// Table rows (PsFields.tables). Mutations caught: runs dropped by the encoder, a decoder that lets
// runs through on another message type, with segments or a codec, out of order, or not adding up
// to the keys frame; a reply's runs dropped; job tables that lose a setting on the way.
TEST(PsProtocolTest, TableRunsRoundTripAndBadOnesAreRefused) {
  PsRequest r;
  r.type = wire::PUSH;
  r.worker = 1;
  r.num_keys = 7;
  r.has_values = true;
  r.tables = {{0, 3}, {2, 4}};
  r.parts = 2;
  r.part = 1;
  wire::Header h = EncodeRequest(r);
  h.set_num_keys(7);
  auto back = DecodeRequest(h);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tables, r.tables);
  auto refused = [](wire::Header bad, const char* what) {
    auto d = DecodeRequest(bad);
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << what;
  };
  wire::Header bad = h;
  bad.set_num_keys(8);
  refused(bad, "runs that do not add up to the keys");
  bad = h;
  bad.mutable_ps()->mutable_tables(1)->set_table(0);
  refused(bad, "a table twice / out of order");
  bad = h;
  bad.mutable_ps()->mutable_tables(0)->set_ids(0);
  refused(bad, "a run of no ids");
  bad = h;
  bad.set_type(wire::JOIN);
  refused(bad, "rows on a JOIN");
  bad = h;
  bad.set_codec("fp16");
  refused(bad, "rows with a codec");
  bad = h;
  auto* seg = bad.add_segments();
  seg->set_offset(0);
  seg->set_length(4);
  refused(bad, "rows with segments");
  PsReply reply = ReplyTo(*back, wire::PULL_REPLY, 0);
  reply.tables = r.tables;
  reply.num_keys = 7;
  wire::Header rh = EncodeReply(reply);
  rh.set_num_keys(7);
  auto rb = DecodeReply(rh);
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(rb->tables, r.tables);
  // The job's tables, every setting through JobConfig and back; a bad one named.
  TableSpec t;
  t.name = "user";
  t.dim = 16;
  t.num_ids = 1000;
  t.init = {RowInit::Kind::kUniform, 0.25f};
  t.init_seed = 3;
  t.max_rows_per_shard = 77;
  t.optimizer.kind = RowOptimizerKind::kAdagrad;
  t.optimizer.initial_accumulator = 0.5f;
  wire::JobConfig job;
  SetJobTables(std::vector<TableSpec>{t}, &job);
  auto tables = JobTables(job);
  ASSERT_TRUE(tables.ok()) << tables.status();
  ASSERT_EQ(tables->size(), 1u);
  EXPECT_EQ((*tables)[0].name, "user");
  EXPECT_EQ((*tables)[0].dim, 16);
  EXPECT_EQ((*tables)[0].num_ids, 1000u);
  EXPECT_EQ((*tables)[0].init.kind, RowInit::Kind::kUniform);
  EXPECT_FLOAT_EQ((*tables)[0].init.scale, 0.25f);
  EXPECT_EQ((*tables)[0].max_rows_per_shard, 77);
  EXPECT_EQ((*tables)[0].optimizer.kind, RowOptimizerKind::kAdagrad);
  EXPECT_FLOAT_EQ((*tables)[0].optimizer.initial_accumulator, 0.5f);
  SetJobTables(std::vector<TableSpec>{t, t}, &job);
  EXPECT_NE(JobTables(job).status().message().find("two tables are named 'user'"), std::string::npos);
  job.mutable_tables(0)->set_optimizer("lamb");
  EXPECT_NE(JobTables(job).status().message().find("table 'user'"), std::string::npos);
}

TEST(PsProtocolTest, APushCarriesTheWorkersOwnRateOrNone) {
  PsRequest r;
  r.type = wire::PUSH;
  r.segments = {{0, 4}};
  auto none = DecodeRequest(EncodeRequest(r));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(std::isnan(none->push.lr));
  EXPECT_FALSE(EncodeRequest(r).ps().has_lr());
  for (float lr : {0.0125f, 0.0f, 3e-7f}) {
    r.push.lr = lr;
    auto back = DecodeRequest(EncodeRequest(r));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->push.lr, lr);
  }
}

TEST(PsProtocolTest, ARateThatCannotBeOneIsRefused) {
  for (float lr : {-0.1f, INFINITY, -INFINITY, NAN}) {
    wire::Header h;
    PsRequest r;
    r.type = wire::PUSH;
    h = EncodeRequest(r);
    h.mutable_ps()->set_lr(lr);
    auto back = DecodeRequest(h);
    EXPECT_EQ(back.status().code(), StatusCode::kInvalidArgument) << lr;
    EXPECT_NE(back.status().message().find("is not a finite number >= 0"), std::string::npos) << back.status();
  }
  PsRequest pull;
  pull.type = wire::PULL;
  wire::Header h = EncodeRequest(pull);
  h.mutable_ps()->set_lr(0.1f);
  EXPECT_EQ(DecodeRequest(h).status().code(), StatusCode::kInvalidArgument);  // only a push has a rate
}

TEST(PsProtocolTest, InitCarriesTheJobAndPullTheCodec) {
  PsRequest init;
  init.type = wire::INIT;
  init.job.set_num_params(10);
  init.job.set_lr(0.5f);
  init.segments = {{0, 10}};
  auto a = DecodeRequest(EncodeRequest(init));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->job.num_params(), 10u);
  EXPECT_FLOAT_EQ(a->job.lr(), 0.5f);
  PsRequest pull;
  pull.type = wire::PULL;
  pull.codec = "topk:0.1";
  auto b = DecodeRequest(EncodeRequest(pull));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->codec, "topk:0.1");
  EXPECT_EQ(b->parts, 0);
}

TEST(PsProtocolTest, LarsAndLambRoundTripAndAreChecked) {
  OptimizerOptions lars;
  lars.kind = OptimizerKind::kLars;
  lars.momentum = 0.9f;
  lars.weight_decay = 1e-4f;
  lars.trust_coefficient = 0.02;
  wire::JobConfig job;
  job.add_tensors()->set_name("w");
  SetJobOptimizer(lars, &job);
  EXPECT_EQ(job.optimizer(), "lars");
  auto back = JobOptimizer(job);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, OptimizerKind::kLars);
  EXPECT_EQ(back->momentum, 0.9f);
  EXPECT_EQ(back->trust_coefficient, 0.02);
  EXPECT_EQ(back->weight_decay, 1e-4f);
  wire::JobConfig bad = job;
  bad.set_trust_coefficient(0);
  EXPECT_EQ(JobOptimizer(bad).status().code(), StatusCode::kInvalidArgument);
  bad = job;
  bad.set_nesterov(true);
  EXPECT_EQ(JobOptimizer(bad).status().code(), StatusCode::kInvalidArgument);

  OptimizerOptions lamb;
  lamb.kind = OptimizerKind::kLamb;
  lamb.beta1 = 0.8;
  lamb.eps = 1e-6;
  lamb.weight_decay = 0.01f;
  wire::JobConfig lamb_job;
  lamb_job.add_tensors()->set_name("w");
  SetJobOptimizer(lamb, &lamb_job);
  back = JobOptimizer(lamb_job);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, OptimizerKind::kLamb);
  EXPECT_EQ(back->beta1, 0.8);
  EXPECT_EQ(back->beta2, 0.999);
  EXPECT_EQ(back->eps, 1e-6);
  bad = lamb_job;
  bad.set_momentum(0.9f);
  EXPECT_EQ(JobOptimizer(bad).status().code(), StatusCode::kInvalidArgument);
  for (wire::JobConfig* j : {&job, &lamb_job}) {
    auto* t = j->add_tensors();
    t->set_name("emb");
    t->set_sparse(true);
    const Status sparse = JobOptimizer(*j).status();
    EXPECT_EQ(sparse.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(sparse.message().find("applies to dense models; tensor 'emb' is sparse"), std::string::npos) << sparse;
  }
}

TEST(PsProtocolTest, TheJobsOptimizerRoundTripsAndIsChecked) {
  OptimizerOptions adam;
  adam.kind = OptimizerKind::kAdam;
  adam.beta1 = 0.8;
  adam.beta2 = 0.99;
  adam.eps = 1e-6;
  adam.weight_decay = 0.01f;
  wire::JobConfig job;
  job.add_tensors()->set_name("w");
  SetJobOptimizer(adam, &job);
  auto back = JobOptimizer(job);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, OptimizerKind::kAdam);
  EXPECT_EQ(back->beta1, 0.8);
  EXPECT_EQ(back->beta2, 0.99);
  EXPECT_EQ(back->eps, 1e-6);
  EXPECT_EQ(back->weight_decay, 0.01f);
  wire::JobConfig sgd;  // an older worker's job: no optimizer named, SGD's settings
  sgd.set_momentum(0.9f);
  sgd.set_nesterov(true);
  back = JobOptimizer(sgd);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, OptimizerKind::kSgd);
  EXPECT_EQ(back->momentum, 0.9f);
  EXPECT_TRUE(back->nesterov);
  auto refused = [&](auto change) {
    wire::JobConfig j = job;
    change(j);
    return JobOptimizer(j).status();
  };
  EXPECT_EQ(refused([](wire::JobConfig& j) { j.set_optimizer("adagrad"); }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused([](wire::JobConfig& j) { j.set_adam_beta2(1.0); }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused([](wire::JobConfig& j) { j.set_adam_eps(0.0); }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused([](wire::JobConfig& j) { j.set_momentum(0.9f); }).code(), StatusCode::kInvalidArgument);
  const Status sparse = refused([](wire::JobConfig& j) {
    auto* t = j.add_tensors();
    t->set_name("emb");
    t->set_sparse(true);
  });
  EXPECT_EQ(sparse.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(sparse.message().find("tensor 'emb' is sparse"), std::string::npos) << sparse;
}

TEST(PsProtocolTest, ARequestThatCannotBeRightIsRefused) {
  auto bad = [](auto mutate) {
    PsRequest r;
    r.type = wire::PUSH;
    r.segments = {{0, 4}};
    wire::Header h = EncodeRequest(r);
    mutate(h);
    return DecodeRequest(h).status().code();
  };
  EXPECT_EQ(bad([](wire::Header&) {}), StatusCode::kOk);
  // An offset whose sum with its length would overflow never becomes a Segment.
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_segments(0)->set_offset(uint64_t{1} << 62); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_segments(0)->set_length(~uint64_t{0}); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.set_sender_role(wire::SERVER); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.set_type(wire::REGISTER); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.set_type(wire::PULL_REPLY); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_ps()->set_parts(kMaxPushParts + 1); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_ps()->set_parts(-1); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_ps()->set_parts(4); h.mutable_ps()->set_part(4); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](wire::Header& h) { h.mutable_ps()->set_part(1); }), StatusCode::kInvalidArgument);  // a part of no parts
  EXPECT_EQ(bad([](wire::Header& h) { h.set_type(wire::PULL); h.mutable_ps()->set_parts(2); }), StatusCode::kInvalidArgument);
}

// A message's values are in its own frames or named by one reference to a value channel; what a
// reference may hold depends on the message, and anything else is refused.
TEST(PsProtocolTest, AValueReferenceRoundTripsAndOnlyWhereItBelongs) {
  PsRequest push;
  push.type = wire::PUSH;
  push.segments = {{0, 4}};
  EXPECT_FALSE(EncodeRequest(push).ps().has_values_at()) << "ZeroMQ's own frames need no reference";
  push.at.channel = wire::CHANNEL_LANE;
  push.at.seq = 3;
  auto lane = DecodeRequest(EncodeRequest(push));
  ASSERT_TRUE(lane.ok()) << lane.status();
  EXPECT_EQ(lane->at.channel, wire::CHANNEL_LANE);
  EXPECT_EQ(lane->at.seq, 3u);
  PsRequest attach;
  attach.type = wire::CHANNEL_ATTACH;
  attach.segments = {{0, 4}};
  attach.at.channel = wire::CHANNEL_DATA;
  attach.at.attach = std::string(kDataTokenBytes, 't');
  auto token = DecodeRequest(EncodeRequest(attach));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->at.attach, attach.at.attach);

  auto request = [](wire::Type type, auto mutate) {
    PsRequest r;
    r.type = type;
    r.segments = {{0, 4}};
    wire::Header h = EncodeRequest(r);
    mutate(*h.mutable_ps()->mutable_values_at());
    return DecodeRequest(h).status().code();
  };
  const auto bad = StatusCode::kInvalidArgument;
  EXPECT_EQ(request(wire::PUSH, [](wire::ValueRef& v) { v.set_channel(wire::CHANNEL_DATA); v.set_seq(1); }), StatusCode::kOk);
  EXPECT_EQ(request(wire::PULL, [](wire::ValueRef& v) { v.set_channel(wire::CHANNEL_LANE); }), StatusCode::kOk);
  EXPECT_EQ(request(wire::PUSH, [](wire::ValueRef& v) { v.set_channel(wire::CHANNEL_LANE); }), bad);  // no number
  EXPECT_EQ(request(wire::PULL, [](wire::ValueRef& v) { v.set_channel(wire::CHANNEL_DATA); v.set_seq(1); }), bad);
  EXPECT_EQ(request(wire::PUSH, [](wire::ValueRef& v) { v.set_seq(1); }), bad);  // a number over ZeroMQ
  EXPECT_EQ(request(wire::JOIN, [](wire::ValueRef& v) { v.set_channel(wire::CHANNEL_LANE); }), bad);
  EXPECT_EQ(request(wire::PUSH, [](wire::ValueRef& v) { v.set_channel(static_cast<wire::Channel>(7)); v.set_seq(1); }), bad);
  EXPECT_EQ(request(wire::PUSH, [](wire::ValueRef& v) { v.set_channel(wire::CHANNEL_DATA); v.set_seq(1); v.set_port(9); }), bad);
  EXPECT_EQ(request(wire::PULL, [](wire::ValueRef& v) { v.set_attach("x"); }), bad);
  EXPECT_EQ(request(wire::CHANNEL_ATTACH, [](wire::ValueRef& v) { v.set_attach("x"); }), bad);  // which channel?
  EXPECT_EQ(request(wire::CHANNEL_ATTACH, [](wire::ValueRef& v) { v.set_channel(wire::CHANNEL_LANE); }), bad);  // no name
  EXPECT_EQ(request(wire::CHANNEL_ATTACH, [](wire::ValueRef& v) { v.set_channel(wire::CHANNEL_DATA); v.set_attach("short"); }), bad);

  PsReply answer = ReplyTo(push, wire::PULL_REPLY, 0);
  answer.segments = {{0, 4}};
  answer.at.channel = wire::CHANNEL_DATA;
  answer.at.seq = 8;
  auto frame = DecodeReply(EncodeReply(answer));
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->at.channel, wire::CHANNEL_DATA);
  EXPECT_EQ(frame->at.seq, 8u);
  PsReply port = ReplyTo(attach, wire::CHANNEL_ATTACH_REPLY, 0);
  port.at.channel = wire::CHANNEL_DATA;
  port.at.port = 5555;
  auto ported = DecodeReply(EncodeReply(port));
  ASSERT_TRUE(ported.ok()) << ported.status();
  EXPECT_EQ(ported->at.port, 5555);
  auto reply = [&](wire::Type type, auto mutate) {
    PsReply r = ReplyTo(push, type, 0);
    wire::Header h = EncodeReply(r);
    mutate(h);
    return DecodeReply(h).status().code();
  };
  EXPECT_EQ(reply(wire::PULL_REPLY, [](wire::Header& h) { h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_DATA); }), bad);
  EXPECT_EQ(reply(wire::PUSH_REPLY, [](wire::Header& h) { h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_LANE); }), bad);
  EXPECT_EQ(reply(wire::CHANNEL_ATTACH_REPLY, [](wire::Header& h) { h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_DATA); }), bad);
  EXPECT_EQ(reply(wire::CHANNEL_ATTACH_REPLY, [](wire::Header& h) { h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_LANE); }), StatusCode::kOk);
  EXPECT_EQ(reply(wire::PULL_REPLY, [](wire::Header& h) { h.mutable_ps()->set_parts(2); }), bad) << "only a lane's answer comes in parts";
  EXPECT_EQ(reply(wire::PULL_REPLY, [](wire::Header& h) { h.mutable_ps()->set_parts(2); h.mutable_ps()->mutable_values_at()->set_channel(wire::CHANNEL_LANE); }), StatusCode::kOk);
}

TEST(PsProtocolTest, OptimizerStateMessagesRoundTripAndAreChecked) {
  PsRequest push;
  push.type = wire::STATE_PUSH;
  push.worker = 1;
  push.request_id = 5;
  push.clock = 12;
  push.segments = {{0, 1024}};
  push.state.optimizer = "adam";
  push.state.steps = 12;
  push.state.slots = 2;
  push.state.slot = 1;
  auto back = DecodeRequest(EncodeRequest(push));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->type, wire::STATE_PUSH);
  EXPECT_EQ(back->state.optimizer, "adam");
  EXPECT_EQ(back->state.steps, 12);
  EXPECT_EQ(back->state.slots, 2);
  EXPECT_EQ(back->state.slot, 1);
  EXPECT_EQ(back->segments, push.segments);

  PsReply reply = ReplyTo(push, wire::STATE_PULL_REPLY, 1);
  reply.version = 24;
  reply.state.optimizer = "sgd";
  reply.state.steps = 7;
  reply.state.slots = 1;
  reply.segments = {{1024, 2048}};
  auto r = DecodeReply(EncodeReply(reply));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type, wire::STATE_PULL_REPLY);
  EXPECT_EQ(r->version, 24);
  EXPECT_EQ(r->state.optimizer, "sgd");
  EXPECT_EQ(r->state.steps, 7);
  EXPECT_EQ(r->state.slots, 1);
  EXPECT_EQ(r->state.slot, 0);
  EXPECT_EQ(r->segments, reply.segments);

  auto bad = [&](wire::Type type, auto mutate) {
    PsRequest q = push;
    q.type = type;
    if (type == wire::STATE_PULL) q.state.steps = q.state.slots = q.state.slot = 0;
    wire::Header h = EncodeRequest(q);
    mutate(h);
    return DecodeRequest(h).status();
  };
  auto none = [](wire::Header&) {};
  EXPECT_TRUE(bad(wire::STATE_PUSH, none).ok());
  EXPECT_TRUE(bad(wire::STATE_PULL, none).ok());
  EXPECT_TRUE(bad(wire::STATE_PULL, [](wire::Header& h) { h.mutable_ps()->mutable_state()->clear_optimizer(); }).ok());  // any optimizer
  // A push names its optimizer, a known one; steps and vectors in range.
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->clear_optimizer(); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_optimizer("adagrad"); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PULL, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_optimizer("adagrad"); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_steps(-1); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_steps(kMaxOptimizerSteps + 1); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_slots(kMaxOptimizerSlots + 1); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_slots(-1); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_slot(2); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_slot(-1); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->clear_slots(); h.mutable_ps()->mutable_state()->set_slot(1); }).ok());
  EXPECT_TRUE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->clear_slots(); h.mutable_ps()->mutable_state()->clear_slot(); }).ok());
  // A pull names an optimizer at most; no other message carries state fields.
  EXPECT_FALSE(bad(wire::STATE_PULL, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_steps(1); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PULL, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_slots(1); }).ok());
  EXPECT_TRUE(bad(wire::PUSH, none).ok());  // a PUSH encodes no state fields
  EXPECT_FALSE(bad(wire::PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_optimizer("adam"); }).ok());
  EXPECT_FALSE(bad(wire::PULL, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_steps(2); }).ok());
  EXPECT_FALSE(bad(wire::JOIN, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_slot(1); }).ok());
  PsReply wrong = reply;
  wrong.state.slot = 1;  // of 1
  EXPECT_FALSE(DecodeReply(EncodeReply(wrong)).ok());
  wrong = reply;
  wrong.state.optimizer.clear();
  EXPECT_FALSE(DecodeReply(EncodeReply(wrong)).ok());
}

TEST(PsProtocolTest, AParameterSetRoundTripsAndCarriesNoStateFields) {
  PsRequest set;
  set.type = wire::STATE_PUSH;
  set.worker = 0;
  set.request_id = 9;
  set.clock = 3;
  set.segments = {{0, 1024}};
  set.state.params = true;
  auto back = DecodeRequest(EncodeRequest(set));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->state.params);
  EXPECT_EQ(back->state.slots, 0);
  EXPECT_TRUE(back->state.optimizer.empty());
  PsReply reply = ReplyTo(set, wire::STATE_PUSH_REPLY, 0);
  reply.state.params = true;
  auto r = DecodeReply(EncodeReply(reply));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->state.params);
  // An optimizer state set is not a parameter set.
  set.state.params = false;
  set.state.optimizer = "sgd";
  back = DecodeRequest(EncodeRequest(set));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->state.params);

  auto bad = [&](wire::Type type, auto mutate) {
    PsRequest q;
    q.type = type;
    q.segments = {{0, 1024}};
    wire::Header h = EncodeRequest(q);
    h.mutable_ps()->mutable_state()->set_params(true);
    mutate(h);
    return DecodeRequest(h).status();
  };
  auto none = [](wire::Header&) {};
  EXPECT_TRUE(bad(wire::STATE_PUSH, none).ok());
  EXPECT_FALSE(bad(wire::STATE_PULL, none).ok()) << "parameters are read with PULL";
  EXPECT_FALSE(bad(wire::PUSH, none).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_optimizer("sgd"); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_steps(1); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->set_slots(1); }).ok());
  EXPECT_FALSE(bad(wire::STATE_PUSH, [](wire::Header& h) { h.mutable_ps()->mutable_state()->add_skipped(0); }).ok());
}

TEST(PsProtocolTest, RepliesRoundTripAndAnErrorIsAlwaysAFailure) {
  PsRequest pull;
  pull.type = wire::PULL;
  pull.request_id = 9;
  pull.clock = 4;
  PsReply r = ReplyTo(pull, wire::PULL_REPLY, 1);
  r.version = 17;
  r.staleness.wait_ms = 2.5;
  r.staleness.clock_staleness = 3;
  r.segments = {{8, 16}};
  r.codec = "fp16";
  auto back = DecodeReply(EncodeReply(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->type, wire::PULL_REPLY);
  EXPECT_EQ(back->server, 1);
  EXPECT_EQ(back->request_id, 9u);
  EXPECT_EQ(back->clock, 4);
  EXPECT_EQ(back->version, 17);
  EXPECT_DOUBLE_EQ(back->staleness.wait_ms, 2.5);
  EXPECT_EQ(back->staleness.clock_staleness, 3);
  EXPECT_EQ(back->segments, r.segments);
  EXPECT_EQ(back->codec, "fp16");

  PsReply push = ReplyTo(pull, wire::PUSH_REPLY, 0);
  push.staleness.version_lag = 6;
  EXPECT_EQ(DecodeReply(EncodeReply(push))->staleness.version_lag, 6);

  PsReply err = ReplyTo(pull, wire::ERROR, 0);
  err.error = AbortedError("old clock");
  auto e = DecodeReply(EncodeReply(err));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->error.code(), StatusCode::kAborted);
  EXPECT_EQ(e->error.message(), "old clock");
  // A code this build does not know, or "OK" in an ERROR, still fails the request.
  for (int code : {0, 7, 99, -1}) {
    wire::Header h = EncodeReply(err);
    h.set_error_code(code);
    auto u = DecodeReply(h);
    ASSERT_TRUE(u.ok());
    EXPECT_EQ(u->error.code(), StatusCode::kUnknown) << code;
  }
  wire::Header request = EncodeRequest(pull);
  EXPECT_EQ(DecodeReply(request).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradsync
