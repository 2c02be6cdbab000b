#include "common/security.h"

#include <zmq.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "common/atomic_file.h"
#include "common/logging.h"

namespace gradsync {
namespace {

std::mutex registry_mu;
std::map<void*, Security>& Registry() {
  static std::map<void*, Security> r;
  return r;
}

bool LookUp(zmq::context_t& ctx, Security* out) {
  std::lock_guard lock(registry_mu);
  auto it = Registry().find(ctx.handle());
  if (it == Registry().end()) return false;
  *out = it->second;
  return true;
}

bool ValidZ85Key(const std::string& k) {
  if (k.size() != 40) return false;
  std::array<uint8_t, 32> raw{};
  return zmq_z85_decode(raw.data(), k.c_str()) != nullptr;
}

std::string Raw(const std::string& z85) {
  std::array<uint8_t, 32> raw{};
  if (zmq_z85_decode(raw.data(), z85.c_str()) == nullptr) return "";
  return std::string(reinterpret_cast<const char*>(raw.data()), raw.size());
}

Result<CurveKeyPair> ReadPair(const std::string& path) {
  std::ifstream f(path);
  if (!f) return NotFoundError(path + ": missing (gradsync-keygen writes it)");
  CurveKeyPair p;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string name, key;
    in >> name >> key;
    if (name == "public") p.public_key = key;
    else if (name == "secret") p.secret_key = key;
    else return InvalidArgumentError(path + ":" + std::to_string(n) + ": expected 'public <key>' or 'secret <key>'");
    if (!ValidZ85Key(key)) return InvalidArgumentError(path + ":" + std::to_string(n) + ": not a 40-character Z85 key");
  }
  if (p.public_key.empty() || p.secret_key.empty()) return InvalidArgumentError(path + ": needs a public and a secret key");
  return p;
}

}  // namespace

Result<CurveKeyPair> GenerateKeyPair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return UnimplementedError(std::string("zmq_curve_keypair failed (libzmq without CURVE?): ") + zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{pub, sec};
}

Status WriteClusterKeys(const std::string& dir, bool overwrite) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError("cannot create " + dir + ": " + ec.message());
  for (const char* f : {"server.key", "client.key", "authorized_keys"}) {
    if (!overwrite && std::filesystem::exists(std::filesystem::path(dir) / f)) {
      return FailedPreconditionError(dir + "/" + f + " exists (--force replaces the cluster's keys)");
    }
  }
  ASSIGN_OR_RETURN(CurveKeyPair server, GenerateKeyPair());
  ASSIGN_OR_RETURN(CurveKeyPair client, GenerateKeyPair());
  auto pair_text = [](const CurveKeyPair& p, const char* what) {
    return std::string("# gradsync CURVE key pair: ") + what + "\npublic " + p.public_key + "\nsecret " + p.secret_key + "\n";
  };
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/server.key", pair_text(server, "binding sockets (scheduler, servers)"), 0600));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/client.key", pair_text(client, "connecting sockets (workers, servers to the scheduler)"), 0600));
  return WriteFileAtomically(dir + "/authorized_keys", "# client public keys the cluster admits\n" + client.public_key + "\n", 0644);
}

Result<Security> LoadSecurity(const std::string& dir) {
  if (!std::filesystem::is_directory(dir)) return NotFoundError("--auth-dir " + dir + ": not a directory (gradsync-keygen " + dir + " makes one)");
  Security s;
  ASSIGN_OR_RETURN(s.server, ReadPair(dir + "/server.key"));
  ASSIGN_OR_RETURN(s.client, ReadPair(dir + "/client.key"));
  std::ifstream f(dir + "/authorized_keys");
  if (!f) return NotFoundError(dir + "/authorized_keys: missing (gradsync-keygen writes it)");
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    if (!ValidZ85Key(line)) return InvalidArgumentError(dir + "/authorized_keys:" + std::to_string(n) + ": not a 40-character Z85 key");
    s.authorized.insert(line);
  }
  if (s.authorized.empty()) return InvalidArgumentError(dir + "/authorized_keys: admits no key");
  return s;
}

CurveAuthenticator::CurveAuthenticator(zmq::context_t& ctx, const Security& security)
    : ctx_(ctx), ctx_handle_(ctx.handle()), socket_(ctx, zmq::socket_type::rep) {
  for (const auto& k : security.authorized) authorized_.insert(Raw(k));
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

CurveAuthenticator::~CurveAuthenticator() {
  {
    std::lock_guard lock(registry_mu);
    Registry().erase(ctx_handle_);
  }
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
}

void CurveAuthenticator::Loop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) <= 0) continue;
      std::vector<zmq::message_t> frames;
      while (true) {
        zmq::message_t f;
        if (!socket_.recv(f, zmq::recv_flags::none)) break;
        const bool more = f.more();
        frames.push_back(std::move(f));
        if (!more) break;
      }
      // RFC 27 request: version, request id, domain, address, identity, mechanism, credentials...
      std::string request_id = frames.size() > 1 ? frames[1].to_string() : "";
      const std::string address = frames.size() > 3 ? frames[3].to_string() : "?";
      const std::string mechanism = frames.size() > 5 ? frames[5].to_string() : "";
      const bool ok = frames.size() >= 7 && frames[0].to_string() == "1.0" && mechanism == "CURVE" &&
                      authorized_.count(frames[6].to_string()) > 0;
      if (ok) {
        admitted_++;
      } else {
        refused_++;
        GRADSYNC_LOG(WARNING) << "refused a " << (mechanism.empty() ? "malformed" : mechanism)
                              << " connection from " << address << ": its key is not in the cluster's authorized_keys";
      }
      const std::array<std::string, 6> reply{"1.0", request_id, ok ? "200" : "400", ok ? "OK" : "unauthorized key",
                                             ok ? "gradsync" : "", ""};
      for (size_t i = 0; i < reply.size(); ++i) {
        socket_.send(zmq::buffer(reply[i]), i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      GRADSYNC_LOG(WARNING) << "ZAP handler: " << e.what();
    }
  }
}

Result<std::unique_ptr<CurveAuthenticator>> EnableCurve(zmq::context_t& ctx, const Security& security) {
  if (!zmq_has("curve")) return UnimplementedError("this libzmq was built without CURVE");
  std::unique_ptr<CurveAuthenticator> auth;
  try {
    auth.reset(new CurveAuthenticator(ctx, security));
  } catch (const zmq::error_t& e) {
    return UnavailableError(std::string("cannot serve ZAP on this context: ") + e.what());
  }
  std::lock_guard lock(registry_mu);
  Registry()[ctx.handle()] = security;
  return auth;
}

Result<std::unique_ptr<CurveAuthenticator>> EnableCurveFromDir(zmq::context_t& ctx, const std::string& dir) {
  ASSIGN_OR_RETURN(Security sec, LoadSecurity(dir));
  return EnableCurve(ctx, sec);
}

void ApplyCurveServer(zmq::context_t& ctx, zmq::socket_t& socket) {
  Security s;
  if (!LookUp(ctx, &s)) return;
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, s.server.secret_key);
  socket.set(zmq::sockopt::zap_domain, "gradsync");
}

void ApplyCurveClient(zmq::context_t& ctx, zmq::socket_t& socket) {
  Security s;
  if (!LookUp(ctx, &s)) return;
  socket.set(zmq::sockopt::curve_serverkey, s.server.public_key);
  socket.set(zmq::sockopt::curve_publickey, s.client.public_key);
  socket.set(zmq::sockopt::curve_secretkey, s.client.secret_key);
}

}  // namespace gradsync
