// The primary's side of replication (Replicator, server/replication.h), against backups played by
// plain sockets: a worker's reply leaves only once every live backup has acknowledged the entry
// it waits on; a backup that stays silent holds it until it is dropped (what the server does
// when the scheduler declares that backup dead); a backup that refuses to keep copies is not
// waited on; one out of step gets a new snapshot, and replies wait until it holds one.
#include "server/replication/replication.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <thread>

#include "common/base/status.h"
#include "common/net/transport.h"

namespace gradsync {
namespace {

constexpr int kShard = 0;
const std::string kKey = "0123456789abcdef";

// An entry of shard kShard's log as the primary makes it (the Replicator stamps the rest).
ReplicaEntry Entry(wire::ReplicaOp op) {
  ReplicaEntry e;
  e.op = op;
  if (op == wire::REPLICA_META) e.snapshot.meta = "meta";
  return e;
}

class ReplicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = Socket::BindRouter(ctx_, "inproc://replicator-shard", 0);
    ASSERT_TRUE(s.ok()) << s.status();
    shard_ = std::make_unique<Socket>(std::move(s).value());
    auto w = Socket::ConnectDealer(ctx_, "inproc://replicator-shard", "shard");
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = std::make_unique<Socket>(std::move(w).value());
    // The shard learns the worker's identity from a first message, as from a push.
    wire::Header hello;
    hello.set_type(wire::HEARTBEAT);
    ASSERT_TRUE(worker_->Send("", hello).ok());
    auto got = shard_->Recv(2000);
    ASSERT_TRUE(got.ok()) << got.status();
    worker_peer_ = got->peer;
    for (int rank : {1, 2}) {
      auto b = Socket::BindRouter(ctx_, "127.0.0.1", 0);
      ASSERT_TRUE(b.ok()) << b.status();
      wire::NodeInfo info;
      info.set_host("127.0.0.1");
      info.set_port(b->port());
      infos_[rank] = info;
      backups_[rank] = std::make_unique<Socket>(std::move(b).value());
    }
  }

  // Gives every backup its snapshot (a META, which it reads) as the server does for NeedSnapshot.
  void Snapshot(Replicator& r, int backup) {
    r.SendSnapshotEntry(backup, Entry(wire::REPLICA_META));
    r.SnapshotSent(backup);
    auto meta = backups_[backup]->Recv(5000);
    ASSERT_TRUE(meta.ok()) << meta.status();
    EXPECT_EQ(meta->header.replica().op(), wire::REPLICA_META);
    EXPECT_EQ(meta->header.replica().key(), kKey);
    EXPECT_EQ(meta->header.replica().index(), 0u);
    primary_peer_[backup] = meta->peer;
  }

  // What backup `b` reads next: the entry's sequence number.
  uint64_t Read(int b) {
    auto m = backups_[b]->Recv(5000);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return 0;
    EXPECT_EQ(m->header.type(), wire::REPLICATE);
    EXPECT_EQ(m->header.replica().shard(), kShard);
    primary_peer_[b] = m->peer;
    return m->header.request_id();
  }

  void Ack(int b, uint64_t seq) {
    wire::Header h;
    h.set_type(wire::REPLICATE_REPLY);
    h.set_request_id(seq);
    ASSERT_TRUE(backups_[b]->Send(primary_peer_[b], h).ok());
  }

  void Refuse(int b, StatusCode code, const std::string& why) {
    wire::Header h;
    h.set_type(wire::ERROR);
    h.set_error_code(static_cast<int>(code));
    h.set_error_message(why);
    ASSERT_TRUE(backups_[b]->Send(primary_peer_[b], h).ok());
  }

  // Polls the replicator for up to `ms` (the server polls on every turn of its loop) and returns
  // the request ids of the replies the worker got.
  std::vector<uint64_t> Replies(Replicator& r, int ms) {
    std::vector<uint64_t> ids;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
      r.Poll(*shard_);
      while (true) {
        auto m = worker_->Recv(0);
        if (!m.ok()) break;
        ids.push_back(m->header.request_id());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return ids;
  }

  wire::Header PushReply(uint64_t id) {
    wire::Header h;
    h.set_type(wire::PUSH_REPLY);
    h.set_request_id(id);
    return h;
  }

  TransportContext ctx_{1};
  std::unique_ptr<Socket> shard_, worker_;
  std::string worker_peer_;
  std::map<int, std::unique_ptr<Socket>> backups_;
  std::map<int, wire::NodeInfo> infos_;
  std::map<int, std::string> primary_peer_;
};

TEST_F(ReplicatorTest, AReplyWaitsForEveryLiveBackupAndASilentOneHoldsItUntilDropped) {
  Replicator r(ctx_, kShard, kKey);
  r.SetBackups(infos_);
  EXPECT_EQ(r.NeedSnapshot(), (std::vector<int>{1, 2}));
  for (int b : {1, 2}) ASSERT_NO_FATAL_FAILURE(Snapshot(r, b));
  EXPECT_TRUE(r.NeedSnapshot().empty());
  ASSERT_TRUE(r.active());

  const uint64_t seq = r.Send(Entry(wire::REPLICA_PUSH));
  r.Hold(seq, worker_peer_, PushReply(42));
  EXPECT_EQ(Read(1), seq);
  EXPECT_EQ(Read(2), seq);
  EXPECT_TRUE(Replies(r, 200).empty()) << "a reply left before any backup held the push";

  Ack(1, seq);
  EXPECT_TRUE(Replies(r, 300).empty()) << "a reply left while backup 2 did not hold the push";
  EXPECT_EQ(r.waiting(), 1u);

  // Backup 2 stays silent: declared dead, it is dropped, and the reply goes.
  std::map<int, wire::NodeInfo> live{{1, infos_[1]}};
  r.SetBackups(live);
  EXPECT_EQ(Replies(r, 300), std::vector<uint64_t>{42});
  EXPECT_EQ(r.waiting(), 0u);
}

TEST_F(ReplicatorTest, RepliesLeaveInOrderAsTheirEntriesAreAcknowledged) {
  Replicator r(ctx_, kShard, kKey);
  r.SetBackups({{1, infos_[1]}});
  ASSERT_NO_FATAL_FAILURE(Snapshot(r, 1));
  std::vector<uint64_t> seqs;
  for (uint64_t id = 1; id <= 3; ++id) {
    seqs.push_back(r.Send(Entry(wire::REPLICA_PUSH)));
    r.Hold(seqs.back(), worker_peer_, PushReply(100 + id));
  }
  for (uint64_t s : seqs) EXPECT_EQ(Read(1), s);
  Ack(1, seqs[0]);
  EXPECT_EQ(Replies(r, 300), std::vector<uint64_t>{101});
  // An acknowledgement covers every entry before it.
  Ack(1, seqs[2]);
  EXPECT_EQ(Replies(r, 300), (std::vector<uint64_t>{102, 103}));
  // A late acknowledgement of an old entry changes nothing.
  const uint64_t next = r.Send(Entry(wire::REPLICA_PUSH));
  r.Hold(next, worker_peer_, PushReply(104));
  EXPECT_EQ(Read(1), next);
  Ack(1, seqs[1]);
  EXPECT_TRUE(Replies(r, 200).empty());
  Ack(1, next);
  EXPECT_EQ(Replies(r, 300), std::vector<uint64_t>{104});
}

TEST_F(ReplicatorTest, ABackupThatRefusesTheShardIsNotWaitedOn) {
  Replicator r(ctx_, kShard, kKey);
  r.SetBackups(infos_);
  for (int b : {1, 2}) ASSERT_NO_FATAL_FAILURE(Snapshot(r, b));
  Refuse(2, StatusCode::kPermissionDenied, "server 2 keeps no copy of shard 0");
  EXPECT_TRUE(Replies(r, 200).empty());  // the server reads it on a turn of its loop
  const uint64_t seq = r.Send(Entry(wire::REPLICA_PUSH));
  r.Hold(seq, worker_peer_, PushReply(7));
  EXPECT_EQ(Read(1), seq);
  Ack(1, seq);
  EXPECT_EQ(Replies(r, 300), std::vector<uint64_t>{7});
  EXPECT_TRUE(r.NeedSnapshot().empty()) << "a backup that refuses is sent no snapshot";
  EXPECT_TRUE(r.active());
  // Nothing more goes to it.
  EXPECT_FALSE(backups_[2]->Recv(100).ok());
}

TEST_F(ReplicatorTest, ABackupOutOfStepGetsANewSnapshotAndRepliesWaitForIt) {
  Replicator r(ctx_, kShard, kKey);
  r.SetBackups({{1, infos_[1]}});
  ASSERT_NO_FATAL_FAILURE(Snapshot(r, 1));
  const uint64_t first = r.Send(Entry(wire::REPLICA_PUSH));
  EXPECT_EQ(Read(1), first);
  Refuse(1, StatusCode::kDataLoss, "entry 1 after 3: a gap");
  EXPECT_TRUE(Replies(r, 200).empty());  // the server reads it on a turn of its loop
  // The next push is not sent to it (its copy is out of step) and its reply waits.
  const uint64_t seq = r.Send(Entry(wire::REPLICA_PUSH));
  r.Hold(seq, worker_peer_, PushReply(9));
  EXPECT_TRUE(Replies(r, 300).empty()) << "a reply left while the only backup held no whole copy";
  EXPECT_EQ(r.NeedSnapshot(), std::vector<int>{1});
  EXPECT_FALSE(backups_[1]->Recv(50).ok()) << "an entry went to a copy that is out of step";
  // A new snapshot (index 0 again) holds the log up to now; once acknowledged, the reply goes.
  ASSERT_NO_FATAL_FAILURE(Snapshot(r, 1));
  Ack(1, r.last_seq());
  EXPECT_EQ(Replies(r, 300), std::vector<uint64_t>{9});
}

TEST(BackupRanksTest, CopiesGoToTheNextRanksAround) {
  EXPECT_EQ(BackupRanks(0, 2, 3), std::vector<int>{1});
  EXPECT_EQ(BackupRanks(2, 3, 4), (std::vector<int>{3, 0}));
  EXPECT_EQ(BackupRanks(1, 1, 4), std::vector<int>{});
  EXPECT_EQ(BackupRanks(1, 5, 3), (std::vector<int>{2, 0}));  // never the shard's own rank
}

}  // namespace
}  // namespace gradsync
