#include "worker/channels/worker_zmq_channel.h"

namespace gradsync {

Status WorkerZmqChannel::SendPush(const PushSource& v, ValueRef*, Payload* p) {
  p->has_values = true;
  if (v.encoded) {
    p->values_frame = v.encoded;
  } else if (v.runs.size() == 1 && v.keys.empty()) {
    p->values = v.grads.subspan(static_cast<size_t>(v.runs[0].begin), static_cast<size_t>(v.runs[0].size()));
    p->lent = lent_;  // zero-copy: ZeroMQ reads the gradient buffer itself
  } else {
    values_.clear();
    for (const auto& run : v.runs) values_.insert(values_.end(), v.grads.begin() + run.begin, v.grads.begin() + run.end);
    values_.insert(values_.end(), v.values.begin(), v.values.end());
    p->values = values_;  // copied by Send
    p->keys = v.keys;
  }
  return OkStatus();
}

Status WorkerZmqChannel::ReadPull(const Message& m, const PsReply& r, float* target, Status*) {
  if (target == nullptr) return OkStatus();  // nothing beside the message to read past
  size_t pos = 0;
  for (const Segment& seg : r.segments) {
    m.CopyValues(target + seg.begin, pos, static_cast<size_t>(seg.size()));
    pos += static_cast<size_t>(seg.size());
  }
  const auto keys = m.Keys(&keys_);
  key_values_.resize(keys.size());
  m.CopyValues(key_values_.data(), pos, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] < static_cast<uint64_t>(range_.begin) || keys[i] >= static_cast<uint64_t>(range_.end)) {
      return DataLossError("pull reply key out of range");
    }
    target[keys[i]] = key_values_[i];
  }
  return OkStatus();
}

}  // namespace gradsync
