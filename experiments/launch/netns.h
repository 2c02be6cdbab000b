// Link emulation for one run: every process in its own network namespace, each joined by a veth
// pair to a private bridge (itself in a namespace of its own), both ends of every veth shaped
// with `tc qdisc ... tbf` to the link rate (so each host has a full-duplex link of that rate
// to the switch), and tc netem for added latency. Addresses are 10.213.0.<host + 1>/24 and
// exist only inside these namespaces: nothing reaches the machine's own interfaces.
//
// Needs root and iproute2 (ip, tc); without them Create fails with a line that says so.
// Everything is torn down by the destructor (also after a failed run), and namespaces that a
// killed gradsync-run left behind are removed by the next one (their names carry its pid).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "experiments/spec/link.h"

namespace gradsync {

struct LinkSpec {
  std::string rate;       // tc rate: "100mbit"; "": namespaces and veth pairs, unshaped
  double delay_ms = 0;    // one-way latency added on every link (netem)
  // TCP's congestion control in every host's namespace (net.ipv4.tcp_congestion_control: cubic,
  // bbr, reno...); "": the one a new namespace starts with, the machine's.
  std::string congestion_control;
};

class NetworkEmulation {
 public:
  static Result<std::unique_ptr<NetworkEmulation>> Create(int hosts, const LinkSpec& link);
  ~NetworkEmulation();
  NetworkEmulation(const NetworkEmulation&) = delete;
  NetworkEmulation& operator=(const NetworkEmulation&) = delete;

  // The argv prefix that runs a command inside host i's namespace.
  std::vector<std::string> Prefix(int host) const;
  static std::string Address(int host);
  const std::string& ns(int host) const { return namespaces_[static_cast<size_t>(host)]; }
  // The TCP congestion control the hosts' namespaces use (read back from the first).
  const std::string& congestion_control() const { return congestion_control_; }

  // Removes namespaces of earlier gradsync-run processes that no longer exist.
  static void RemoveStale();

 private:
  NetworkEmulation() = default;
  Status Build(int hosts, const LinkSpec& link);
  // Sets TCP's congestion control in namespace ns.
  Status SetCongestionControl(const std::string& ns, const std::string& name);
  void TearDown();

  std::string prefix_;
  std::string bridge_ns_;
  std::vector<std::string> namespaces_;
  std::string congestion_control_;
};

}  // namespace gradsync
