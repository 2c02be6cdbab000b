#include "common/net/security.h"

#include <zmq.h>

#include <sys/stat.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "common/base/atomic_file.h"
#include "common/base/logging.h"

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

std::string Octal(mode_t mode) {
  char b[8];
  std::snprintf(b, sizeof b, "%04o", static_cast<unsigned>(mode & 07777));
  return b;
}

// A secret key file: private to its owner, as ssh wants its keys. Its directory was checked.
Status CheckPrivate(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return OkStatus();  // missing: ReadPair says so
  if (st.st_mode & 077) {
    return InvalidArgumentError(path + ": permissions " + Octal(st.st_mode) +
                                " are too open: a secret key must be readable by its owner only (chmod 600 " + path + ")");
  }
  return OkStatus();
}

Status CheckDirectory(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return NotFoundError("--auth-dir " + dir + ": cannot stat it");
  if (st.st_mode & 022) {
    return InvalidArgumentError(dir + ": permissions " + Octal(st.st_mode) +
                                " let group or others replace its keys (chmod go-w " + dir + ")");
  }
  return OkStatus();
}

// A .key file ("public <z85>", "secret <z85>"); a .pub file holds the public line alone.
Result<CurveKeyPair> ReadPair(const std::string& path, bool with_secret) {
  if (with_secret) RETURN_IF_ERROR(CheckPrivate(path));
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
    else if (name == "secret" && with_secret) p.secret_key = key;
    else return InvalidArgumentError(path + ":" + std::to_string(n) + ": expected 'public <key>'" +
                                     (with_secret ? " or 'secret <key>'" : " only (a .pub file holds no secret)"));
    if (!ValidZ85Key(key)) return InvalidArgumentError(path + ":" + std::to_string(n) + ": not a 40-character Z85 key");
  }
  if (p.public_key.empty() || (with_secret && p.secret_key.empty())) {
    return InvalidArgumentError(path + (with_secret ? ": needs a public and a secret key" : ": needs a public key"));
  }
  return p;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Result<CurveKeyPair> GenerateKeyPair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return UnimplementedError(std::string("zmq_curve_keypair failed (libzmq without CURVE?): ") + zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{pub, sec};
}

std::string KeyFingerprint(const std::string& z85_public_key) { return z85_public_key.substr(0, 8); }

Status WriteClusterKeys(const std::string& dir, bool overwrite) {
  std::error_code ec;
  if (std::filesystem::create_directories(dir, ec)) {
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);  // LoadSecurity wants it private
  }
  if (ec) return UnavailableError("cannot create " + dir + ": " + ec.message());
  for (const char* f : {"server.key", "server.pub", "client.key", "authorized_keys"}) {
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
  RETURN_IF_ERROR(WriteFileAtomically(
      dir + "/server.pub", "# gradsync CURVE public key of the binding sockets (workers check it)\npublic " + server.public_key + "\n",
      0644));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/client.key", pair_text(client, "connecting sockets (workers, servers to the scheduler)"), 0600));
  return WriteFileAtomically(dir + "/authorized_keys", "# client public keys the cluster admits\n" + client.public_key + "\n", 0644);
}

Result<Security> LoadSecurity(const std::string& dir, KeyRole role) {
  if (!std::filesystem::is_directory(dir)) return NotFoundError("--auth-dir " + dir + ": not a directory (gradsync-keygen " + dir + " makes one)");
  RETURN_IF_ERROR(CheckDirectory(dir));
  Security s;
  if (role == KeyRole::kWorker) {
    // The servers' public key only: a worker cannot pose as a shard or the scheduler.
    ASSIGN_OR_RETURN(s.server, ReadPair(dir + "/server.pub", /*with_secret=*/false));
    ASSIGN_OR_RETURN(s.client, ReadPair(dir + "/client.key", true));
    return s;
  }
  ASSIGN_OR_RETURN(s.server, ReadPair(dir + "/server.key", true));
  ASSIGN_OR_RETURN(s.client, ReadPair(dir + "/client.key", true));
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
        LogRefusal(address, mechanism, frames.size() >= 7 ? frames[6].to_string() : "");
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

void CurveAuthenticator::LogRefusal(const std::string& address, const std::string& mechanism, const std::string& raw_key) {
  std::string fingerprint = "(none)";
  if (raw_key.size() == 32) {
    char z85[41];
    if (zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(raw_key.data()), 32)) fingerprint = KeyFingerprint(z85);
  }
  // A stranger may try a fresh key every time: past kMaxLoggedKeys remembered keys (those quiet
  // for an interval are forgotten first), the others share one entry.
  const double now = NowSeconds();
  if (!refusals_.count(fingerprint) && refusals_.size() >= kMaxLoggedKeys) {
    std::erase_if(refusals_, [&](const auto& r) { return now - r.second.logged_at > kLogIntervalS && r.second.unlogged == 0; });
    if (refusals_.size() >= kMaxLoggedKeys) fingerprint = "(other keys)";
  }
  Refusals& r = refusals_[fingerprint];
  if (now - r.logged_at < kLogIntervalS) {
    r.unlogged++;
    return;
  }
  GRADSYNC_LOG(WARNING) << "authentication failed: refused a " << (mechanism.empty() ? "malformed" : mechanism)
                        << " connection from " << address << " with client key " << fingerprint
                        << "...: not in this cluster's authorized_keys"
                        << (r.unlogged > 0 ? " (and " + std::to_string(r.unlogged) + " more refusals of this key since the last line)"
                                           : std::string());
  r.logged_at = now;
  r.unlogged = 0;
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

Result<std::unique_ptr<CurveAuthenticator>> EnableCurveFromDir(zmq::context_t& ctx, const std::string& dir,
                                                               KeyRole role) {
  ASSIGN_OR_RETURN(Security sec, LoadSecurity(dir, role));
  return EnableCurve(ctx, sec);
}

Status ApplyCurveServer(zmq::context_t& ctx, zmq::socket_t& socket) {
  Security s;
  if (!LookUp(ctx, &s)) return OkStatus();
  if (s.server.secret_key.empty()) {
    return FailedPreconditionError("this process holds no server.key (a worker's --auth-dir), so it cannot serve CURVE");
  }
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, s.server.secret_key);
  socket.set(zmq::sockopt::zap_domain, "gradsync");
  return OkStatus();
}

void ApplyCurveClient(zmq::context_t& ctx, zmq::socket_t& socket) {
  Security s;
  if (!LookUp(ctx, &s)) return;
  socket.set(zmq::sockopt::curve_serverkey, s.server.public_key);
  socket.set(zmq::sockopt::curve_publickey, s.client.public_key);
  socket.set(zmq::sockopt::curve_secretkey, s.client.secret_key);
}

bool CurveEnabled(zmq::context_t& ctx) {
  Security s;
  return LookUp(ctx, &s);
}

}  // namespace gradsync
