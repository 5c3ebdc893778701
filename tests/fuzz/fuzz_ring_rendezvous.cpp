// libFuzzer target for the ring's rendezvous messages (gradus/comm/ring/rendezvous_messages.hpp):
// byte 0 picks the reader and a world size (bit 0: a registration, as rank 0 reads what
// anyone may send to its rendezvous port; else rank 0's answer, as rank k reads it, for a
// world of 1 + (byte 0 >> 1) % 8 ranks); the rest is the message. An accepted registration
// has the magic line and at least one address, and written back with format_registration it
// parses to the same fields; an accepted answer has a data address and a point-to-point
// address for every rank, a data-path address each where its transport has a data path
// (none otherwise), a count >= 1 of ranks per machine for each, and written back with
// format_answer it parses to the same. Nothing throws: a bad message is a reason in `why`.
#include "fuzz_check.hpp"

#include <gradus/comm/ring/rendezvous_messages.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace ring = gradus::ring;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string why;
  if (data[0] & 1) {
    const auto r = ring::parse_registration(text, why);
    if (!r) {
      FUZZ_CHECK(!why.empty());
      return 0;
    }
    FUZZ_CHECK(!r->addrs.empty());
    // Written back: the same fields.
    std::string why2;
    const auto back = ring::parse_registration(ring::format_registration(*r), why2);
    FUZZ_CHECK(back && back->rank == r->rank && back->world == r->world && back->host == r->host &&
               back->machine == r->machine && back->want == r->want && back->job == r->job && back->pid == r->pid &&
               back->launch == r->launch && back->addrs == r->addrs);
    return 0;
  }
  const int world = 1 + (data[0] >> 1) % 8;
  bool refused = false;
  const auto a = ring::parse_answer(text, world, why, refused);
  if (!a) {
    FUZZ_CHECK(!why.empty());
    return 0;
  }
  FUZZ_CHECK(!refused);
  const auto w = static_cast<std::size_t>(world);
  FUZZ_CHECK(a->table.size() == w && a->p2p_table.size() == w && a->local_ranks.size() == w);
  FUZZ_CHECK(a->data_table.size() == (ring::has_data_path(a->transport) ? w : 0u));
  for (const int c : a->local_ranks) FUZZ_CHECK(c >= 1);
  std::string why2;
  bool refused2 = false;
  const auto back = ring::parse_answer(ring::format_answer(*a), world, why2, refused2);
  FUZZ_CHECK(back && back->transport == a->transport && back->zmq_scheme == a->zmq_scheme && back->table == a->table &&
             back->p2p_table == a->p2p_table && back->data_table == a->data_table && back->local_ranks == a->local_ranks);
  return 0;
}
