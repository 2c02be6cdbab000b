// PushPullService: the values' path of a shard server. A PUSH's values are read from the channel
// it names (ShardChannels), checked against the shard's range and decoded, gathered with its
// parts and counted by the core, acknowledged before the update runs (BytePS's recipe; with
// backups once every one holds it) and applied, or held for its bsp round. A PULL is validated
// and answered when the consistency rule allows it, else parked and answered as soon as it can
// (or refused when a worker that ended training blocks it). CHANNEL_ATTACH moves a worker's
// values to a shared-memory lane or a data channel. It counts pushes, pulls, version lags and
// clock stalenesses, and keeps a PullRecord per answered pull when asked (tests).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/status.h"
#include "common/net/transport.h"
#include "common/ps/ps_protocol.h"
#include "server/requests/error_replies.h"
#include "server/requests/state_service.h"
#include "server/server_checkpoints.h"
#include "server/server_options.h"
#include "server/server_registration.h"
#include "server/server_shard.h"

namespace gradsync {

class PushPullService {
 public:
  PushPullService(TransportContext& ctx, bool record_pulls, Socket& socket, ServerShard& shard,
                  const ServerRegistration& registration, ServerCheckpoints& checkpoints, StateService& state,
                  ErrorReplies& replies, RequestStats& stats)
      : ctx_(ctx),
        record_pulls_(record_pulls),
        socket_(socket),
        shard_(shard),
        registration_(registration),
        checkpoints_(checkpoints),
        state_(state),
        replies_(replies),
        stats_(stats) {}

  Status HandlePush(const PsRequest& r, Message& m);
  Status HandlePull(PsRequest r, Message& m);
  // CHANNEL_ATTACH: the worker's values go through a lane or a data channel from now on.
  Status HandleAttach(const PsRequest& r, const Message& m);
  // A dead worker's rooms in the channels and its half-sent push go.
  void DetachWorker(int w);
  // A bsp round is complete: the core applies it (ShardCore::ApplyRound), the backups hear of it.
  void ApplyRound();
  // What the rule lets through now: parked pulls and STATE_PULLs answered (or refused), and the
  // optimizer states waiting for their quiescent point set.
  void AnswerParked();
  const std::vector<PullRecord>& pull_log() const { return pull_log_; }

 private:
  Status HandlePushMessage(const PsRequest& r, Message& m, ShardChannel& channel);
  // A push message's values, from the channel it names (values/shard_channels.h), checked
  // against the shard's range and decoded: one chunk of the push.
  Result<PushChunk> ReadPush(const PsRequest& r, Message& m, ShardChannel& channel);
  // Answers a validated pull (its keys given), raw or (--compress-pull) as a compressed delta.
  void AnswerPull(const PsRequest& r, const Message& m, std::span<const uint64_t> keys, double waited_ms);
  // Counts an answered pull with the clock staleness its reply carried.
  void RecordPull(const PsRequest& r, int64_t clock_staleness);

  TransportContext& ctx_;
  const bool record_pulls_;
  Socket& socket_;
  ServerShard& shard_;
  const ServerRegistration& registration_;
  ServerCheckpoints& checkpoints_;
  StateService& state_;
  ErrorReplies& replies_;
  RequestStats& stats_;
  std::vector<uint64_t> key_buffer_;
  std::vector<PullRecord> pull_log_;
};

}  // namespace gradsync
