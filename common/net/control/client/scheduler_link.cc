#include "common/net/control/client/scheduler_link.h"

#include <sstream>
#include <thread>

#include "common/base/clock.h"
#include "common/base/logging.h"

namespace gradsync {
namespace {
using Clock = std::chrono::steady_clock;
std::chrono::duration<double> Seconds(double s) { return std::chrono::duration<double>(s); }
}  // namespace

SchedulerLink::SchedulerLink(TransportContext& ctx, const SchedulerClientOptions& options, JobStanding& standing,
                             const Registration& self, std::function<void(const ControlMessage&)> deliver)
    : options_(options), ctx_(ctx), standing_(standing), self_(self), deliver_(std::move(deliver)) {}

void SchedulerLink::Send(ControlMessage c) {
  c.sender_role = options_.self.role();
  c.sender_rank = self_.rank();
  std::lock_guard lock(mu_);
  outbox_.push_back(std::move(c));
}

void SchedulerLink::Run(std::stop_token stop) {
  // The largest thing the scheduler sends is a gather's release (every member's data).
  auto sock = Socket::ConnectDealer(ctx_, options_.scheduler_endpoint, "scheduler", kMaxSchedulerReplyBytes);
  if (sock.ok()) {
    if (Status w = sock->WatchHandshakes(ctx_); !w.ok()) GRADSYNC_LOG(WARNING) << w;
  }
  if (!sock.ok()) {
    standing_.Fail(sock.status());
    return;
  }
  LinkState link;
  link.last_heard = Clock::now();
  link.next_beat = Clock::now();
  PauseDetector pause(options_.scheduler_timeout_s / 2);
  while (!stop.stop_requested()) {
    SendQueued(*sock, link);
    ReceiveOne(*sock, link);
    // Retrying cannot help: the keys are wrong. Said once, as what it is (not "silent").
    if (Status hs = sock->HandshakeStatus(); !hs.ok()) standing_.Fail(hs);
    {
      std::lock_guard lock(mu_);
      traffic_ = sock->traffic();
    }
    // A long gap between two turns of this loop means this process was paused (SIGSTOP, a
    // swapped-out machine): the scheduler's silence is ours. It gets a fresh timeout to answer
    // the next heartbeat (it may say this node was declared dead meanwhile).
    if (const double paused = pause.Turn(); paused > 0) {
      GRADSYNC_LOG(WARNING) << "this process was paused for " << paused << " s";
      link.last_heard = Clock::now();
      link.next_beat = Clock::now();
    }
    CheckSilence(*sock, link);
    if (!told_unhealthy_) {
      Status h = standing_.health();
      if (!h.ok()) {
        told_unhealthy_ = true;
        std::lock_guard lock(on_unhealthy_mu_);
        if (on_unhealthy_) on_unhealthy_(h);
      }
    }
  }
}

void SchedulerLink::SendQueued(Socket& sock, LinkState& link) {
  std::deque<ControlMessage> out;
  {
    std::lock_guard lock(mu_);
    out.swap(outbox_);
  }
  for (auto& c : out) {
    if (c.type == wire::HEARTBEAT) c.probe.sent_us = SteadyMicros();  // a clock probe
    (void)sock.Send("", EncodeControl(c));
  }
  if (!out.empty()) cv_.notify_all();
  if (Clock::now() >= link.next_beat) {
    ControlMessage beat = Control(wire::HEARTBEAT);
    beat.sender_role = options_.self.role();
    beat.sender_rank = self_.rank();
    beat.probe.sent_us = SteadyMicros();
    (void)sock.Send("", EncodeControl(beat));
    link.next_beat = Clock::now() + std::chrono::duration_cast<Clock::duration>(Seconds(options_.heartbeat_interval_s));
  }
}

void SchedulerLink::ReceiveOne(Socket& sock, LinkState& link) {
  auto m = sock.Recv(5);
  if (!m.ok()) return;
  link.last_heard = Clock::now();
  link.heard = true;
  auto c = m->malformed.ok() ? DecodeControl(m->header) : Result<ControlMessage>(m->malformed);
  if (c.ok()) deliver_(*c);
}

void SchedulerLink::CheckSilence(Socket& sock, LinkState& link) {
  // Silent past the timeout: a scheduler whose connection is still up is alive (paused or
  // starved: it judges nobody while it does not run, so waiting costs nothing), and gets up to
  // kSchedulerUpFactor timeouts; one whose connection closed (it died) is lost at once.
  const auto silent = Clock::now() - link.last_heard;
  // (The connection's state is asked only past the timeout: not on every 5 ms turn.)
  const bool up = link.heard && silent > Seconds(options_.scheduler_timeout_s) && sock.PeerConnected();
  if (silent > Seconds(options_.scheduler_timeout_s) && up && !link.said_waiting) {
    GRADSYNC_LOG(WARNING) << "the scheduler at " << options_.scheduler_endpoint << " has been silent for "
                          << options_.scheduler_timeout_s << " s but its connection is up (paused or starved?): "
                          << "waiting up to " << kSchedulerUpFactor * options_.scheduler_timeout_s << " s";
    link.said_waiting = true;
  }
  if (silent <= Seconds(options_.scheduler_timeout_s)) link.said_waiting = false;
  if (silent > Seconds(options_.scheduler_timeout_s * (up ? kSchedulerUpFactor : 1.0)) && standing_.ok()) {
    std::ostringstream seconds;
    seconds << options_.scheduler_timeout_s * (up ? kSchedulerUpFactor : 1.0);
    standing_.Fail(link.heard ? UnavailableError("lost the scheduler at " + options_.scheduler_endpoint +
                                                 ": silent for " + seconds.str() + " s")
                              : UnavailableError("could not reach the scheduler at " + options_.scheduler_endpoint +
                                                 ": no answer in " + seconds.str() +
                                                 " s (is it running there? --scheduler=HOST:PORT)"));
  }
}

void SchedulerLink::Flush(double timeout_s) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, Seconds(timeout_s), [&] { return outbox_.empty() || !standing_.ok(); });
  lock.unlock();
  // The frames are queued in ZeroMQ now; give its I/O thread a moment to write them out.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

TrafficCounters SchedulerLink::traffic() const {
  std::lock_guard lock(mu_);
  return traffic_;
}

void SchedulerLink::set_on_unhealthy(std::function<void(const Status&)> fn) {
  std::lock_guard lock(on_unhealthy_mu_);
  on_unhealthy_ = std::move(fn);
}

void SchedulerLink::Wake() {
  std::lock_guard lock(mu_);
  cv_.notify_all();
}

}  // namespace gradsync
