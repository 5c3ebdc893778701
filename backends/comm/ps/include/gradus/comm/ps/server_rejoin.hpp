#pragma once
// A parameter server taking back a lost worker's restart (async and ssp): server's member
// functions for the three moments of a rejoin.
//
//   hello    the new process says it is a restart (GRADUS_RESTART_COUNT, which gradus-run
//            --max-restarts sets) of a rank this server lost: it is revived (its new
//            connection known, still out of the clocks and collectives) and told it must join
//   join     server 0 parks it until the workers' next join point — a barrier the workers
//            mark as a place where a newcomer can fall in step (the data-parallel step's
//            pull_state at an epoch's end: every worker at the same clock, no collective in
//            flight); the other servers take it back at once, at the clock server 0 gave
//   admit    at the join point every waiting restart comes back at the live workers' clock
//            and learns the next collective's number; the join point's answer tells the
//            others which ranks came back, so that all of them compare the run fingerprint
//            with the newcomer next (data_parallel_step::pull_state)
//
// A job that ends (the chief's shutdown, every worker gone) while a restart waits answers
// it `job_over` (nothing left to train); a job that fails answers it the failure. BSP takes
// no worker back: losing one failed the job. Included at the end of server.hpp; not a
// header to include alone.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/comm/ps/server.hpp"
#include "gradus/comm/ps/wire.hpp"
#include "gradus/core/error.hpp"

namespace gradus::ps {

/// The hello of a restart of lost worker `rank`, on connection `id` (server_setup.hpp's hello
/// has checked the rest): revived, not yet counted, and told to join.
template <class Compute>
void server<Compute>::revive(int rank, const std::string& id) {
  auto& w = workers_[static_cast<std::size_t>(rank)];
  if (mode_ == mode::bsp)
    throw error(prefix() + "worker " + std::to_string(rank) + " restarted, but a bsp job cannot take a worker back (losing it " +
                (o_.bsp_continue_without_dead ? "left the survivors averaging without it" : "failed the job") +
                "); run --consistency async or ssp:S for workers that restart");
  if (shutdown_at_) throw error(prefix() + "worker " + std::to_string(rank) + " restarted after the chief ended the job");
  if (w.reviving) {
    // an earlier restart that died before it was taken back: forget its parked join
    std::erase_if(parked_joins_, [&](const parked& p) { return p.id == w.id; });
  }
  w.reviving = true;
  w.id = id;
  o_.log(prefix() + "worker " + std::to_string(rank) + " restarted (lost at clock " + std::to_string(w.clock) + "): it comes back at " +
         (o_.index == 0 ? "the workers' next join point (an epoch's end)" : "the clock server 0 gives it"));
}

/// A restarted worker asks to be taken back: server 0 parks it until the next join point;
/// another server takes it back at the clock server 0 gave (h.clock). From a worker that is
/// already back (a rejoin resent to a restarted server), it is answered at its clock.
template <class Compute>
void server<Compute>::join(int rank, const std::string& id, const wire::header& h) {
  auto& w = workers_[static_cast<std::size_t>(rank)];
  auto r = reply_header(h);
  if (!w.reviving) {
    if (w.left) throw error(prefix() + "join from worker " + std::to_string(rank) + ", which left this job");
    w.clock = std::max(w.clock, h.clock);
    r.clock = w.clock;
    send(id, r, std::span<const std::byte>{});
    return;
  }
  if (o_.index != 0) {
    admit(rank, h.clock);
    r.clock = h.clock;
    send(id, r, std::span<const std::byte>{});
    serve_parked();
    return;
  }
  if (shutdown_at_) {
    r.key = wire::job_over;
    send(id, r, std::span<const std::byte>{});
    return;
  }
  if (live_workers() == 0) throw error(no_one_to_rejoin());
  parked_joins_.push_back({id, h});
}

template <class Compute>
std::string server<Compute>::no_one_to_rejoin() const {
  return prefix() + "no worker of the job is training (each left or was lost" +
         (workers_[0].dead ? ", the chief (worker 0) lost" : "") + "): a restart has no one to rejoin, and the job failed";
}

/// After a worker left or was lost: restarts waiting for a join point that cannot come are
/// answered (job_over once the chief ended the job, else a failure), and the server is done
/// once every worker has left and no restart is on its way back.
template <class Compute>
void server<Compute>::after_a_worker_left() {
  if (live_workers() == 0 && !parked_joins_.empty()) end_waiting_joins(shutdown_at_ ? std::string() : no_one_to_rejoin());
  if (every_worker_gone()) done_ = true;
}

template <class Compute>
void server<Compute>::admit(int rank, std::uint64_t clock) {
  auto& w = workers_[static_cast<std::size_t>(rank)];
  w.reviving = false;
  w.left = w.dead = false;
  w.clock = clock;
  ++stats_.workers_rejoined;
  o_.log(prefix() + "worker " + std::to_string(rank) + " is back at clock " + std::to_string(clock) + "; " + std::to_string(live_workers()) +
         " workers train");
}

/// Join point `seq` is complete: every waiting restart comes back at the live workers' clock
/// (the largest: they are alike at an epoch's end), answered with it and the next
/// collective's number. Returns the join point's answer: 1 for each rank taken back.
template <class Compute>
std::vector<std::byte> server<Compute>::admit_waiting(std::uint64_t seq) {
  std::vector<std::byte> back(workers_.size(), std::byte{0});
  if (parked_joins_.empty()) return back;
  std::uint64_t clock = 0;
  for (const auto& w : workers_)
    if (!w.left) clock = std::max(clock, w.clock);
  for (const auto& p : parked_joins_) {
    const auto rank = static_cast<std::size_t>(p.h.rank);
    if (rank >= workers_.size() || !workers_[rank].reviving || workers_[rank].id != p.id) continue;
    admit(static_cast<int>(rank), clock);
    back[rank] = std::byte{1};
    auto r = reply_header(p.h);
    r.clock = clock;
    r.offset = seq + 1;
    send(p.id, r, std::span<const std::byte>{});
  }
  parked_joins_.clear();
  return back;
}

/// The job ended (failure empty: job_over) or failed while restarts waited to join.
template <class Compute>
void server<Compute>::end_waiting_joins(const std::string& failure) {
  for (const auto& p : parked_joins_) {
    if (failure.empty()) {
      auto r = reply_header(p.h);
      r.key = wire::job_over;
      send(p.id, r, std::span<const std::byte>{});
    } else {
      send(p.id, fail_header(p.h), std::string_view(failure));
    }
  }
  parked_joins_.clear();
}

/// Every worker has left (goodbye or lost) and no restart is on its way back.
template <class Compute>
bool server<Compute>::every_worker_gone() const {
  return std::all_of(workers_.begin(), workers_.end(), [](const worker& w) { return w.left && !w.reviving; });
}

}  // namespace gradus::ps
