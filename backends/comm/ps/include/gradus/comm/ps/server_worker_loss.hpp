#pragma once
// A parameter server's lost workers: server's member functions that read the socket
// monitor's events (a connection closed; a CURVE client refused) and act on a worker whose
// connection closed without a goodbye: bsp fails the job naming it (every parked request
// and collective in flight answered with the reason: fail_job), or, with bsp_continue_without_dead
// and in async and ssp, the survivors go on without it. Included at the end of
// server.hpp; not a header to include alone.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/comm/ps/server.hpp"
#include "gradus/core/fault_file.hpp"

namespace gradus::ps {

template <class Compute>
void server<Compute>::monitor_events() {
  for (int budget = 0; budget < 256; ++budget) {
    const auto ev = mon_.next();
    if (!ev) return;
    const std::uint16_t event = ev->id;
    const std::uint32_t value = ev->value;
    if (std::getenv("GRADUS_PS_DEBUG")) o_.log(prefix() + "event " + std::to_string(event) + " fd " + std::to_string(value));
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && zap_)
      for (const auto& r : zap_->take_new_refusals())
        o_.log(prefix() + "refused a client at " + r.address + " (" + r.mechanism + " key " + r.public_key + "): " + r.reason);
    if (event != ZMQ_EVENT_DISCONNECTED) continue;
    for (std::size_t r = 0; r < workers_.size(); ++r) {
      auto& w = workers_[r];
      if (w.joined && !w.left && w.fd == static_cast<int>(value)) worker_lost(static_cast<int>(r));
      if (w.reviving && w.fd == static_cast<int>(value)) {  // a restart that died before it was taken back
        w.reviving = false;
        std::erase_if(parked_joins_, [&](const parked& p) { return p.id == w.id; });
        o_.log(prefix() + "worker " + std::to_string(r) + "'s restart was lost before it was taken back");
        after_a_worker_left();
      }
    }
  }
}

/// A worker's connection closed without a goodbye: it died, or its heartbeats stopped.
template <class Compute>
void server<Compute>::worker_lost(int r) {
  auto& w = workers_[static_cast<std::size_t>(r)];
  w.left = w.dead = true;
  const std::string who = "worker " + std::to_string(r) + (w.peer_address.empty() ? "" : " (" + w.peer_address + ")");
  if (mode_ == mode::bsp && !o_.bsp_continue_without_dead) {
    fail_job(prefix() + who + " was lost at clock " + std::to_string(w.clock) +
             " (its connection closed: the process died, or it answered no heartbeat for " +
             std::to_string(o_.heartbeat_timeout.count()) + " ms); bsp cannot finish a step without it");
    return;
  }
  o_.log(prefix() + who + " was lost at clock " + std::to_string(w.clock) + "; " + std::to_string(live_workers()) +
         " workers go on without it (" + mode_name(mode_) + ")");
  ++stats_.workers_lost;
  for (auto& [key, sh] : shards_) maybe_apply_bsp(sh, key);
  std::vector<std::uint64_t> seqs;
  for (const auto& [seq, c] : colls_) seqs.push_back(seq);
  for (const auto seq : seqs) finish_collective(seq);
  serve_parked();
  after_a_worker_left();
}

/// The job cannot go on (a bsp worker lost; a worker of another consistency or world size):
/// every parked request and collective in flight is answered with the reason, every later
/// request too (receive_one), and job_failure() gives it, so the servers exit failing.
template <class Compute>
void server<Compute>::fail_job(const std::string& why) {
  if (!job_failed_.empty()) return;
  job_failed_ = why;
  o_.log(job_failed_);
  gradus::detail::record_job_failure("ps " + std::to_string(o_.index), why);  // a launcher restarts the job, not this server
  for (const auto& p : parked_) send(p.id, fail_header(p.h), std::string_view(job_failed_));
  for (const auto& p : parked_inits_) send(p.id, fail_header(p.h), std::string_view(job_failed_));
  parked_.clear();
  parked_inits_.clear();
  end_waiting_joins(job_failed_);
  for (auto& [seq, c] : colls_)
    for (std::size_t k = 0; k < c.ids.size(); ++k)
      if (c.in[k]) send(c.ids[k], c.to(k, true), std::string_view(job_failed_));
  colls_.clear();
}

}  // namespace gradus::ps
