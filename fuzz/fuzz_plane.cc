// libFuzzer target: one plane's encoder and decoder fed any bytes as a wire::Header, without a
// socket in between (fuzz_message reaches the same decoders through the transport and a shard).
// Built once per plane, GRADSYNC_FUZZ_PLANE: 0 the PS plane (common/ps/ps_protocol.h: requests and
// replies), 1 the control plane (common/net/control/control_protocol.h), 2 the replication plane
// (common/ps/replica_protocol.h: entries and answers). Byte 0 bit 0 picks the direction where a
// plane has two (request or reply; entry or answer); the rest is the header.
//
// Fails on: a sanitizer report; a header the decoder takes whose encoding carries another
// plane's fields, or which the decoder then refuses, or which does not come back the same from
// its own encoder (encode(decode(encode(m))) == encode(m), byte for byte).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/net/control/control_protocol.h"
#include "common/ps/ps_protocol.h"
#include "common/ps/replica_protocol.h"
#include "gradsync.pb.h"

namespace {

using gradsync::wire::Header;

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "fuzz_plane: %s\n", why.c_str());
  std::abort();
}

template <typename Decode, typename Encode>
void RoundTrip(const Header& h, Decode decode, Encode encode, Header::PlaneCase plane, const char* what) {
  auto message = decode(h);
  if (!message.ok()) return;
  const Header once = encode(*message);
  if (once.plane_case() != plane) Fail(std::string(what) + " encoded with another plane's fields: " + once.ShortDebugString());
  auto back = decode(once);
  if (!back.ok()) Fail(std::string(what) + " refused in its own encoding: " + back.status().ToString());
  if (encode(*back).SerializeAsString() != once.SerializeAsString()) {
    Fail(std::string(what) + " does not survive its own encoder: " + once.ShortDebugString());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Header h;
  if (!h.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  const bool second = data[0] & 1;
#if GRADSYNC_FUZZ_PLANE == 0
  if (second) {
    RoundTrip(h, gradsync::DecodeReply, gradsync::EncodeReply, Header::kPs, "a shard's reply");
  } else {
    RoundTrip(h, gradsync::DecodeRequest, gradsync::EncodeRequest, Header::kPs, "a worker's request");
  }
#elif GRADSYNC_FUZZ_PLANE == 1
  (void)second;
  RoundTrip(h, gradsync::DecodeControl, gradsync::EncodeControl, Header::kControl, "a control message");
#elif GRADSYNC_FUZZ_PLANE == 2
  if (second) {
    RoundTrip(h, gradsync::DecodeReplicaAck, gradsync::EncodeReplicaAck, Header::kReplica, "a backup's answer");
  } else {
    RoundTrip(h, gradsync::DecodeReplicaEntry, gradsync::EncodeReplicaEntry, Header::kReplica, "a REPLICATE entry");
  }
#else
#error "GRADSYNC_FUZZ_PLANE is 0 (PS), 1 (control) or 2 (replication)"
#endif
  return 0;
}
