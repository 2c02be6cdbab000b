// PartPlan: the overlap of communication with computation (dense models, raw values; BytePS's
// recipe). The dense layout is cut into parts at tensor and shard boundaries, each at most
// part_floats elements (default 1M, 4 MB): an overlapped push sends each tensor's parts the moment
// backward has produced its gradient, and a step's pulls go one request per tensor, in forward
// order. It holds the plan and the open push.
#pragma once

#include <cmath>
#include <optional>
#include <span>
#include <vector>

#include "common/base/numeric/tensor.h"
#include "common/ps/partitioner.h"
#include "worker/channels/worker_channels.h"
#include "worker/ps/client/ps_requests.h"
#include "worker/ps/client/shard_links.h"

namespace gradsync {

class PartPlan {
 public:
  using RequestId = PsRequests::RequestId;

  // `shard_floats[s]`: shard s's dense values (a step's whole request to it).
  PartPlan(const std::vector<TensorInfo>& layout, const Partitioner& partitioner,
           const std::vector<int64_t>& shard_floats, ShardLinks& links, WorkerChannels& channels,
           PsRequests& requests)
      : layout_(layout),
        partitioner_(partitioner),
        shard_floats_(shard_floats),
        links_(links),
        channels_(channels),
        requests_(requests) {}

  // Parts of at most `part_floats` elements (planned again at the next use).
  void set_part_floats(size_t part_floats);
  // BeginPush(clock, grads, lr) opens the push of `clock` (grads lent and lr as for
  // PsClient::Push); PushReady(t) sends tensor t's parts; FinishPush sends what was never reported
  // ready, its parts of the `absent` tensors (as Push's) marked so, and returns the push's id (one
  // reply per shard, as Push). A shard receives its parts in the order sent, numbered
  // (PsFields.parts/part), and counts the push when the last one arrives: bsp, ssp and asp mean
  // what they mean for Push.
  RequestId BeginPush(int64_t clock, ConstFloatSpan grads, float lr = NAN);
  void PushReady(size_t tensor);
  RequestId FinishPush(std::span<const uint32_t> absent = {});
  // Pulls every dense tensor into `params`, one request per tensor, sent in forward order (the
  // first tensor first, so that shards answer it first): Wait(ids[t]) returns once tensor t is
  // in params. Every returned id must be waited for. Sparse tensors get id 0 (not pulled).
  std::vector<RequestId> PullTensors(int64_t clock, FloatSpan params);

 private:
  // A dense part, in offset order.
  struct Part {
    size_t tensor = 0;
    int shard = 0;
    int64_t begin = 0, end = 0;
  };
  // The open overlapped push.
  struct OpenPush {
    RequestId id = 0;
    int64_t clock = 0;
    float lr = NAN;  // on every part
    ConstFloatSpan grads;
    std::vector<int64_t> versions;  // of the last pull, the same on every part
    std::vector<bool> sent;         // per part
    std::vector<int> next;          // per shard: the next part number
    // Per shard: the channel its first part opened (every part alike; ZeroMQ's when the channel
    // beside it did not open); none before its first part.
    std::vector<std::optional<wire::Channel>> opened;
  };
  void Plan();
  void SendPart(size_t part, bool absent = false);

  const std::vector<TensorInfo>& layout_;
  const Partitioner& partitioner_;
  const std::vector<int64_t>& shard_floats_;
  ShardLinks& links_;
  WorkerChannels& channels_;
  PsRequests& requests_;
  size_t part_floats_ = size_t{1} << 20;
  std::vector<Part> parts_;  // empty until planned
  std::vector<std::vector<size_t>> of_tensor_;  // per tensor: its parts
  std::vector<int> per_shard_;                  // per shard: its parts
  OpenPush open_;
};

}  // namespace gradsync
