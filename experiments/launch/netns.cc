#include "experiments/launch/netns.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <regex>

#include "experiments/process/process.h"


namespace gradsync {
namespace {

std::string Burst(const std::string& rate) {
  auto parsed = TcRateBitsPerSecond(rate);
  return std::to_string(static_cast<long long>(TbfBurstBytes(parsed.ok() ? *parsed : 0)));
}

std::atomic<int> g_sequence{0};

const char* const kCongestionControl = "/proc/sys/net/ipv4/tcp_congestion_control";

// A one-line /proc file as a command printed it, without its newline.
std::string Line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace


void NetworkEmulation::RemoveStale() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
    const std::string name = entry.path().filename().string();
    // gsr<pid>x<seq>-...
    if (name.rfind("gsr", 0) != 0) continue;
    const size_t x = name.find('x');
    if (x == std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::atoi(name.substr(3, x - 3).c_str()));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno == EPERM) continue;  // its owner still runs
    (void)RunCommand({"ip", "netns", "del", name});
  }
}

Result<std::unique_ptr<NetworkEmulation>> NetworkEmulation::Create(int hosts, const LinkSpec& link) {
  if (::geteuid() != 0) return FailedPreconditionError("link emulation needs root (network namespaces and tc)");
  if (!OnPath("ip") || !OnPath("tc")) return FailedPreconditionError("link emulation needs iproute2 (ip and tc): apt-get install iproute2");
  RemoveStale();
  auto n = std::unique_ptr<NetworkEmulation>(new NetworkEmulation());
  Status s = n->Build(hosts, link);
  if (!s.ok()) {
    n->TearDown();
    return s.WithContext("setting up link emulation (" + link.rate + ")");
  }
  return n;
}

Status NetworkEmulation::Build(int hosts, const LinkSpec& link) {
  if (hosts < 1 || hosts > 200) return InvalidArgumentError("link emulation takes 1 to 200 hosts");
  prefix_ = "gsr" + std::to_string(::getpid()) + "x" + std::to_string(g_sequence++);
  bridge_ns_ = prefix_ + "-br";
  RETURN_IF_ERROR(RunCommand({"ip", "netns", "add", bridge_ns_}));
  RETURN_IF_ERROR(RunCommand({"ip", "-n", bridge_ns_, "link", "add", "br0", "type", "bridge"}));
  RETURN_IF_ERROR(RunCommand({"ip", "-n", bridge_ns_, "link", "set", "br0", "up"}));
  const std::string burst = Burst(link.rate);
  auto shape = [&](const std::string& ns, const std::string& dev) -> Status {
    if (link.delay_ms > 0) {
      // netem for the latency, tbf under it for the rate.
      RETURN_IF_ERROR(RunCommand({"tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
                                  std::to_string(link.delay_ms) + "ms"})
                          .WithContext("added latency needs the netem qdisc (sch_netem)"));
      if (link.rate.empty()) return OkStatus();  // latency only
      return RunCommand({"tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "tbf", "rate",
                         link.rate, "burst", burst, "latency", "200ms"});
    }
    if (link.rate.empty()) return OkStatus();  // unshaped
    return RunCommand({"tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", link.rate, "burst", burst,
                       "latency", "200ms"});
  };
  for (int h = 0; h < hosts; ++h) {
    const std::string ns = prefix_ + "-h" + std::to_string(h);
    RETURN_IF_ERROR(RunCommand({"ip", "netns", "add", ns}));
    namespaces_.push_back(ns);
    const std::string inner = "gsv" + std::to_string(h), outer = "gsb" + std::to_string(h);
    // Create the pair inside the host's namespace, then move one end to the bridge's.
    RETURN_IF_ERROR(RunCommand({"ip", "-n", ns, "link", "add", inner, "type", "veth", "peer", "name", outer}));
    RETURN_IF_ERROR(RunCommand({"ip", "-n", ns, "link", "set", outer, "netns", bridge_ns_}));
    RETURN_IF_ERROR(RunCommand({"ip", "-n", bridge_ns_, "link", "set", outer, "master", "br0"}));
    RETURN_IF_ERROR(RunCommand({"ip", "-n", bridge_ns_, "link", "set", outer, "up"}));
    RETURN_IF_ERROR(RunCommand({"ip", "-n", ns, "addr", "add", Address(h) + "/24", "dev", inner}));
    RETURN_IF_ERROR(RunCommand({"ip", "-n", ns, "link", "set", inner, "up"}));
    RETURN_IF_ERROR(RunCommand({"ip", "-n", ns, "link", "set", "lo", "up"}));
    RETURN_IF_ERROR(shape(ns, inner));
    RETURN_IF_ERROR(shape(bridge_ns_, outer));
    if (!link.congestion_control.empty()) RETURN_IF_ERROR(SetCongestionControl(ns, link.congestion_control));
  }
  // What the hosts run, set or inherited: the same in every namespace, read in the first.
  ASSIGN_OR_RETURN(std::string now, CommandOutput({"ip", "netns", "exec", namespaces_.front(), "cat", kCongestionControl}));
  congestion_control_ = Line(std::move(now));
  if (!link.congestion_control.empty() && congestion_control_ != link.congestion_control) {
    return FailedPreconditionError("TCP congestion control '" + link.congestion_control + "' was set but reads back '" + congestion_control_ + "'");
  }
  return OkStatus();
}

Status NetworkEmulation::SetCongestionControl(const std::string& ns, const std::string& name) {
  // Checked here too: the name goes into a shell command.
  if (!IsCongestionControlName(name)) return InvalidArgumentError("'" + name + "' is not a TCP congestion control name");
  if (RunCommand({"ip", "netns", "exec", ns, "sh", "-c", "echo " + name + " > " + kCongestionControl}).ok()) return OkStatus();
  auto available = CommandOutput({"ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv4/tcp_available_congestion_control"});
  const std::string avail = available.ok() ? Line(*available) : std::string("unknown");
  // A network namespace may use only what the host allows (tcp_allowed_congestion_control), even
  // among the modules loaded (tcp_available_congestion_control).
  if ((" " + avail + " ").find(" " + name + " ") != std::string::npos) {
    auto allowed = CommandOutput({"cat", "/proc/sys/net/ipv4/tcp_allowed_congestion_control"});
    return FailedPreconditionError("TCP congestion control '" + name + "' is loaded but a network namespace may not use it: the "
                                   "host allows only '" + (allowed.ok() ? Line(*allowed) : std::string("unknown")) +
                                   "' (allow it: sysctl -w net.ipv4.tcp_allowed_congestion_control=\"" +
                                   (allowed.ok() ? Line(*allowed) + " " : std::string()) + name + "\")");
  }
  return FailedPreconditionError("TCP congestion control '" + name + "' is not available here (available: " + avail +
                                 "; another needs its kernel module, e.g. modprobe tcp_" + name + ")");
}


void NetworkEmulation::TearDown() {
  // Deleting a namespace removes its veth ends, and with them their peers.
  for (const auto& ns : namespaces_) (void)RunCommand({"ip", "netns", "del", ns});
  namespaces_.clear();
  if (!bridge_ns_.empty()) (void)RunCommand({"ip", "netns", "del", bridge_ns_});
  bridge_ns_.clear();
}

NetworkEmulation::~NetworkEmulation() { TearDown(); }

std::vector<std::string> NetworkEmulation::Prefix(int host) const { return {"ip", "netns", "exec", ns(host)}; }

std::string NetworkEmulation::Address(int host) { return "10.213.0." + std::to_string(host + 1); }

}  // namespace gradsync
