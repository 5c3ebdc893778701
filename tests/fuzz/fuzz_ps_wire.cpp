// libFuzzer target for the parameter server's wire decoder (gradus/comm/ps/wire.hpp).
// An input becomes 0 to 3 frames (ps_wire_input.hpp), each in a heap block of its own size;
// decode() runs on them with the default limits and with small ones. A message it accepts is
// checked against the frames it came from (the header is frame 0's bytes, the payload is
// frame 1 itself, every promise decode() makes about sizes, ranges and types holds), every
// payload byte is read, and hello/config payloads go through nlohmann::json::parse as the
// server parses them. A broken promise is __builtin_trap(), after a line naming it.
//
// Not covered: the init payload (u32 name length, name, values) and the fields the server
// reads from the JSON are parsed inside server<>'s member functions, not by a free function
// this target could call; a copy of that code here would test the copy.
#include "ps_wire_input.hpp"

#include <gradus/comm/ps/wire.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#define PS_WIRE_CHECK(cond)                                                               \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "fuzz_ps_wire: broken promise at line %d: %s\n", __LINE__, #cond); \
      __builtin_trap();                                                                   \
    }                                                                                     \
  } while (0)

namespace {

namespace wire = gradus::ps::wire;

// Small enough that the fuzzer reaches both sides of every limit.
constexpr wire::limits small_limits{.max_payload = 256, .max_elements = 64};

std::uint64_t sink;  // what the reads of the payload add up to, so they are not optimised away

bool within(std::span<const std::byte> inner, std::span<const std::byte> outer) {
  const std::less_equal<const std::byte*> le;
  return le(outer.data(), inner.data()) && le(inner.data() + inner.size(), outer.data() + outer.size());
}

void check_rejected(const wire::decode_result& r) {
  PS_WIRE_CHECK(!r.msg);
  PS_WIRE_CHECK(std::string_view(r.error).starts_with("malformed message: "));
}

void check_accepted(std::span<const std::span<const std::byte>> frames, const wire::decode_result& r, const wire::limits& lim) {
  PS_WIRE_CHECK(r.msg && r.error.empty());
  const wire::header& h = r.msg->h;
  const auto payload = r.msg->payload;

  PS_WIRE_CHECK(frames.size() == 1 || frames.size() == 2);
  PS_WIRE_CHECK(frames[0].size() == sizeof(wire::header));
  PS_WIRE_CHECK(std::memcmp(&h, frames[0].data(), sizeof h) == 0);
  PS_WIRE_CHECK(h.magic == wire::magic && h.version == wire::version);
  PS_WIRE_CHECK(h.type >= 1 && h.type <= wire::last_type);
  PS_WIRE_CHECK(wire::carried(static_cast<gradus::element_type>(h.dtype)));

  // The payload is the second frame, all of it, and nothing else.
  PS_WIRE_CHECK(h.payload_bytes == payload.size());
  PS_WIRE_CHECK(payload.size() <= lim.max_payload);
  if (frames.size() == 1) {
    PS_WIRE_CHECK(payload.empty());
  } else {
    PS_WIRE_CHECK(payload.size() == frames[1].size());
    PS_WIRE_CHECK(payload.empty() || (payload.data() == frames[1].data() && within(payload, frames[1])));
  }
  for (const std::byte b : payload) sink += std::to_integer<std::uint8_t>(b);  // AddressSanitizer checks each read

  std::uint64_t end = 0;
  PS_WIRE_CHECK(h.count <= lim.max_elements && h.offset <= lim.max_elements);
  PS_WIRE_CHECK(!__builtin_add_overflow(h.offset, h.count, &end) && end <= lim.max_elements);

  const auto t = static_cast<wire::type>(h.type);
  const std::size_t elem = wire::element_size(t, static_cast<gradus::element_type>(h.dtype));
  const auto carries_count_elements = [&] {
    std::uint64_t bytes = 0;
    return elem != 0 && !__builtin_mul_overflow(h.count, elem, &bytes) && bytes == payload.size();
  };
  // two-byte floats (bfloat16, float16) travel in pushes only
  PS_WIRE_CHECK(!wire::half_width(static_cast<gradus::element_type>(h.dtype)) || t == wire::type::push);
  if (t == wire::type::push) PS_WIRE_CHECK(h.count > 0 && carries_count_elements());
  if (t == wire::type::pull) PS_WIRE_CHECK(h.count > 0);
  if (t == wire::type::push_rows || t == wire::type::pull_rows) PS_WIRE_CHECK(elem != 0 && h.offset > 0);
  if (t == wire::type::push_rows) {  // count rows, each a u64 index and `offset` values
    std::uint64_t per_row = 0, bytes = 0;
    PS_WIRE_CHECK(!__builtin_mul_overflow(h.offset, elem, &per_row) && !__builtin_add_overflow(per_row, 8, &per_row) &&
                  !__builtin_mul_overflow(h.count, per_row, &bytes) && bytes == payload.size());
  }
  if (t == wire::type::init_values) PS_WIRE_CHECK(elem != 0 && h.count > 0 && !payload.empty() && payload.size() % (h.count * elem) == 0);
  if (t == wire::type::coll) {
    PS_WIRE_CHECK(h.key >= 1 && h.key <= 5);  // sum, average, broadcast, barrier, join_point
    if (static_cast<wire::coll_op>(h.key) != wire::coll_op::barrier) PS_WIRE_CHECK(carries_count_elements());
  }
}

// hello and config payloads, as server::hello() and server::config() parse them (any
// exception is a refusal there). accept() and parse() must agree on what is JSON.
void parse_json_payload(std::span<const std::byte> payload) {
  const std::string text(reinterpret_cast<const char*>(payload.data()), payload.size());
  const bool valid = nlohmann::json::accept(text);
  try {
    const auto j = nlohmann::json::parse(text);
    PS_WIRE_CHECK(valid);
    sink += j.dump().size();
  } catch (const std::exception&) {
    PS_WIRE_CHECK(!valid);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const gradus::fuzz::message m(std::span<const std::uint8_t>(data, size));
  const auto frames = m.frames();

  const auto d = wire::decode(frames);
  const auto s = wire::decode(frames, small_limits);
  if (d.msg) check_accepted(frames, d, wire::limits{});
  else check_rejected(d);
  if (s.msg) check_accepted(frames, s, small_limits);
  else check_rejected(s);
  PS_WIRE_CHECK(!s.msg || d.msg);  // within the small limits is within the default ones

  if (d.msg) {
    const auto t = static_cast<wire::type>(d.msg->h.type);
    if (t == wire::type::hello || t == wire::type::config) parse_json_payload(d.msg->payload);
  }
  return 0;
}
