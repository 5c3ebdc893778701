// libFuzzer target for the CURVE allow-list (gradus/comm/net/allow_list.hpp):
// allow_list::parse on the input's text, as allow_list::load parses a file's. Every entry
// of an accepted list has a Z85 key and a rank >= 0 or any_rank, and rank_of finds it; the
// list written back with allow_list::line parses to the same entries, and allow() refuses
// each key a second time. Every refusal is a gradus::error naming the list and the line.
#include "fuzz_check.hpp"

#include <gradus/comm/net/allow_list.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace {

namespace net = gradus::net;
const std::string origin = "fuzz.allow";

bool refused(const auto& f, std::string_view prefix) {
  try {
    f();
    return false;
  } catch (const gradus::error& e) {
    FUZZ_CHECK(std::string_view(e.what()).starts_with(prefix));
    return true;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  net::allow_list list;
  if (refused([&] { list = net::allow_list::parse(text, origin); }, "gradus: allow-list '" + origin + "' line ")) return 0;

  std::string written;
  for (const auto& [key, rank] : list.entries()) {
    FUZZ_CHECK(net::z85_key_problem(key).empty());
    FUZZ_CHECK(rank >= 0 || rank == net::any_rank);
    FUZZ_CHECK(list.rank_of(key) == rank);
    written += net::allow_list::line(key, rank, "a comment # with a hash");
  }
  const auto back = net::allow_list::parse(written, origin);
  FUZZ_CHECK(back.entries() == list.entries() && back.size() == list.size());
  if (!list.empty()) {
    auto copy = list;
    const auto& first = *list.entries().begin();
    FUZZ_CHECK(refused([&] { copy.allow(first.first, first.second); }, "gradus: allow_list: key "));
  }
  return 0;
}
