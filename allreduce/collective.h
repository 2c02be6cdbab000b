// Collective: the operations data-parallel training needs across N ranks, with a deadline.
//
// Every operation is collective: all ranks call the same operations in the same order. Each
// carries a sequence tag (op kind + count), and a rank that receives data tagged for another
// operation fails with kInternal naming both, instead of mixing data. A peer that dies or stalls
// makes every other rank fail within options().timeout_s (kUnavailable or kDeadlineExceeded);
// after a failure the collective is unusable (every later call fails at once).
// Not thread-safe: one thread drives a Collective.
//
//   ASSIGN_OR_RETURN(auto ring, RingCollective::Listen("127.0.0.1", options));
//   ... advertise ring->port(), learn every rank's "host:port" ...
//   RETURN_IF_ERROR(ring->Connect(rank, peers, 30));
//   RETURN_IF_ERROR(ring->AllReduce(grads, ReduceOp::kAverage));
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "allreduce/algorithms.h"
#include "allreduce/plan/schedule.h"  // ChunkBegin
#include "common/base/numeric/half.h"
#include "common/base/status.h"
#include "common/base/numeric/tensor.h"
#include "common/base/wait_policy.h"

namespace gradsync {

enum class ReduceOp { kSum, kAverage };

struct CollectiveOptions {
  // Every operation must finish within this many seconds, or it fails on this rank.
  double timeout_s = 30.0;
  // Pipelining granularity: data moves and is reduced in segments of this many bytes, so that
  // sending, receiving and reducing overlap (Gloo uses at most 1 MiB).
  size_t segment_bytes = kDefaultSegmentBytes;
  // SO_SNDBUF and SO_RCVBUF of every connection (0: the kernel's autotuning). Fixed 4 MiB
  // buffers doubled the 2-rank ring's busbw at 4 and 16 MiB over loopback against autotuning
  // (1.5 -> 3.2 GB/s); the kernel caps them at net.core.wmem_max / rmem_max.
  size_t socket_buffer_bytes = size_t{4} << 20;
  // While waiting for a peer, poll (yielding the core between polls) for busy_poll_ms before
  // sleeping (a sleeping rank pays a wake-up per step: tens of microseconds, most of a small
  // all-reduce). 0: always sleep. Its own default, not --busy-poll-ms's.
  WaitPolicy mesh_wait{.busy_poll_ms = 1.0, .pause_spins = 0, .min_polls = 0};
  // Two ranks swapping buffers (halving-doubling, recursive doubling) move them in segments of
  // this many bytes, each rank sending at most one segment beyond what it has received, so that
  // what arrives is still in cache and no socket queue builds up: 1.6-2.3x the busbw of sending
  // whole buffers at once, on loopback, 2 and 4 ranks, 4-64 MiB (bench/README.md). 0: whole.
  size_t exchange_segment_bytes = size_t{128} << 10;
  // Ranks on one host (by their addresses) all-reduce through shared memory (auto: when every rank
  // is on this host; across hosts, hierarchically). Not with an encrypted ring.
  bool shm = false;
  // Shared-memory all-reduce granularity.
  size_t shm_block_bytes = kDefaultShmBlockBytes;
  // The shared-memory group's barriers: after a few pauses, yield the core in a loop this long
  // before sleeping on the futex (a sleeping member must be woken when the last one arrives, which
  // can take longer than the wait did where the cores are busy or idle virtual CPUs are parked).
  WaitPolicy shm_wait{.busy_poll_ms = 20, .pause_spins = 0, .min_polls = 0};  // --busy-poll-ms (WaitPolicyOf)
  // The all-reduce algorithm; auto picks by size and rank count (ChooseAllReduceAlgo). Every
  // rank must use the same one (a rank that disagrees fails, naming both).
  AllReduceAlgo algorithm = AllReduceAlgo::kAuto;
};

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data <- op over all ranks' data (same length on every rank; 0 is allowed).
  virtual Status AllReduce(FloatSpan data, ReduceOp op) = 0;
  // data <- sum over all ranks of 16-bit floats in `format` (IEEE half or bfloat16), rounded to
  // that format after each addition (the fp16 and bf16 codecs and the 16-bit precisions: every
  // rank pre-divides by size() so that the sum is the average and stays in range). Moves half
  // the bytes of AllReduce.
  virtual Status AllReduce16(std::span<uint16_t> data, Float16 format) = 0;
  // Reduce-scatter in place: afterwards this rank's chunk of data holds op over all ranks' chunks;
  // the rest is undefined. Chunk i is [bounds[i], bounds[i + 1]) (n + 1 non-decreasing offsets
  // from 0 to data.size(), the same on every rank), or with no bounds [ChunkBegin(count, n, i),
  // ChunkBegin(count, n, i + 1)). Moves (n-1)/n of the buffer each way: half an all-reduce.
  virtual Status ReduceScatter(FloatSpan data, ReduceOp op, std::span<const size_t> bounds = {}) = 0;
  // All-gather in place: afterwards every chunk i of data holds rank i's chunk i (the layout of
  // ReduceScatter). ReduceScatter then AllGatherChunks is an all-reduce.
  virtual Status AllGatherChunks(FloatSpan data, std::span<const size_t> bounds = {}) = 0;
  // data <- root's data.
  virtual Status Broadcast(FloatSpan data, int root) = 0;
  // out[i] <- rank i's `mine`; sizes may differ between ranks (including empty).
  virtual Status AllGather(std::span<const std::byte> mine, std::vector<std::vector<std::byte>>* out) = 0;
  virtual Status Barrier() = 0;

  // Bytes this rank has sent and received so far, on the wire.
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;
  // Bytes exchanged through shared memory with ranks of this host so far (not in the above;
  // counted as the wire would count them: ShmGroup::bytes_sent).
  virtual uint64_t shm_bytes_sent() const { return 0; }
  virtual uint64_t shm_bytes_received() const { return 0; }
};

// A collective over device memory (NCCL): operations are enqueued on the caller's stream (a
// cudaStream_t, opaque here so that this header needs no CUDA) and return at once;
// SynchronizeDevice waits for the stream with a deadline and fails, without hanging, when a
// peer never takes part.
class DeviceCollective {
 public:
  virtual ~DeviceCollective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data <- op over all ranks, for `count` floats of device memory.
  virtual Status AllReduceDevice(float* device_data, size_t count, ReduceOp op, void* stream) = 0;
  // data <- sum over all ranks of `count` 16-bit floats in `format` of device memory.
  virtual Status AllReduceDevice16(uint16_t* device_data, size_t count, Float16 format, void* stream) = 0;
  // Reduce-scatter and all-gather over `count` floats of device memory, with the chunk layout
  // of Collective (ChunkBegin). count must be a multiple of size() (NCCL's equal chunks).
  virtual Status ReduceScatterDevice(float* device_data, size_t count, ReduceOp op, void* stream) = 0;
  virtual Status AllGatherDevice(float* device_data, size_t count, void* stream) = 0;
  virtual Status SynchronizeDevice(void* stream, double timeout_s) = 0;
  // Float elements handed to all-reduces so far (the transport's bytes are NCCL's own).
  virtual uint64_t elements_reduced() const = 0;
};

}  // namespace gradsync
