#include "worker/channels/worker_data_channel.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

namespace gradsync {
namespace {
// How long a data-channel frame may stall (no byte moving) before the channel is dropped.
constexpr double kDataIdleSeconds = 60.0;
}  // namespace

Result<std::unique_ptr<WorkerDataChannel>> WorkerDataChannel::Attach(const std::string& host, const Segment& range,
                                                                     size_t min_floats, const AskShard& ask,
                                                                     double timeout_s) {
  if (range.size() <= 0) return FailedPreconditionError("an empty range");
  std::string token(kDataTokenBytes, '\0');
  std::random_device rd;
  for (char& c : token) c = static_cast<char>(rd() & 0xff);
  PsRequest r;
  r.type = wire::CHANNEL_ATTACH;
  r.segments = {range};
  r.at.channel = wire::CHANNEL_DATA;
  r.at.attach = token;
  ASSIGN_OR_RETURN(const PsReply reply, ask(std::move(r), timeout_s));
  if (reply.at.channel != wire::CHANNEL_DATA || reply.at.port <= 0) {
    return DataLossError("CHANNEL_ATTACH_REPLY without a data port");
  }
  const int port = reply.at.port;
  ASSIGN_OR_RETURN(DataStream stream, DataStream::Connect(host, port, std::min(timeout_s, 30.0)));
  RETURN_IF_ERROR(stream.Write(std::vector<iovec>{{token.data(), token.size()}}, 5.0));
  char ack[kDataAckBytes];
  if (Status a = stream.Read(ack, sizeof(ack), 5.0); !a.ok() || std::memcmp(ack, kDataAck, kDataAckBytes) != 0) {
    return UnavailableError("data channel to " + host + ":" + std::to_string(port) + " was not accepted" +
                            (a.ok() ? std::string(" (a wrong acknowledgement)") : ": " + a.message()));
  }
  return std::unique_ptr<WorkerDataChannel>(new WorkerDataChannel(std::move(stream), range, min_floats));
}

bool WorkerDataChannel::Large(std::span<const Segment> segments, int64_t whole) const {
  return !segments.empty() && static_cast<size_t>(whole >= 0 ? whole : TotalSize(segments)) >= min_floats_;
}

bool WorkerDataChannel::TakesPush(std::span<const Segment> segments, int64_t whole) const {
  return Large(segments, whole) && Contiguous(segments);
}

bool WorkerDataChannel::TakesPull(std::span<const Segment> segments, int64_t whole) const {
  return Large(segments, whole);
}

Status WorkerDataChannel::SendPush(const PushSource& v, ValueRef* at, Payload*) {
  std::vector<std::span<const float>> values;
  for (const Segment& run : v.runs) {
    values.push_back(v.grads.subspan(static_cast<size_t>(run.begin), static_cast<size_t>(run.size())));
  }
  const uint64_t seq = sent_ + 1;
  RETURN_IF_ERROR(stream_.WriteFrame(seq, values, kDataIdleSeconds));
  sent_ = seq;
  pushed_ += static_cast<uint64_t>(TotalSize(v.runs)) * sizeof(float);
  at->channel = wire::CHANNEL_DATA;
  at->seq = seq;
  return OkStatus();
}

Status WorkerDataChannel::ReadPull(const Message&, const PsReply& r, float* target, Status* broke) {
  *broke = ReadFrame(r, target);
  return OkStatus();
}

Status WorkerDataChannel::ReadFrame(const PsReply& r, float* target) {
  const uint64_t seq = r.at.seq;
  const uint64_t most = static_cast<uint64_t>(range_.size()) * sizeof(float);
  while (true) {
    ASSIGN_OR_RETURN(DataFrameHead head, stream_.ReadHead(kDataIdleSeconds));
    if (head.bytes > most) {
      return DataLossError("a data frame of " + std::to_string(head.bytes) + " bytes (the range holds " +
                           std::to_string(most) + ")");
    }
    if (head.seq < seq) {  // its header never arrived
      RETURN_IF_ERROR(stream_.Discard(head.bytes, kDataIdleSeconds));
      continue;
    }
    if (head.seq > seq) {
      return DataLossError("data frame " + std::to_string(head.seq) + " where " + std::to_string(seq) + " was due");
    }
    if (target == nullptr) return stream_.Discard(head.bytes, kDataIdleSeconds);
    const uint64_t want = static_cast<uint64_t>(TotalSize(r.segments)) * sizeof(float);
    if (head.bytes != want) {
      RETURN_IF_ERROR(stream_.Discard(head.bytes, kDataIdleSeconds));
      return DataLossError("data frame " + std::to_string(seq) + " holds " + std::to_string(head.bytes) +
                           " bytes; the reply's segments need " + std::to_string(want));
    }
    for (const Segment& seg : r.segments) {
      RETURN_IF_ERROR(stream_.Read(target + seg.begin, static_cast<size_t>(seg.size()) * sizeof(float), kDataIdleSeconds));
    }
    pulled_ += head.bytes;
    return OkStatus();
  }
}

ChannelBytes WorkerDataChannel::bytes() const {
  return {pushed_, pulled_, stream_.bytes_written(), stream_.bytes_read()};
}

}  // namespace gradsync
