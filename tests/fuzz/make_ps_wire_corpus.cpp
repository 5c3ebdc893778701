// Writes, or checks, the seed corpus of fuzz_ps_wire (tests/fuzz/corpus/ps_wire): messages
// built with wire::make and nlohmann::json the way the client builds them (hello, config,
// init, push, pull, clock, collectives, bye, shutdown, snapshot, the server's reply and
// fail), payloads the decoder passes but the server refuses, and malformed messages, one for
// each reason decode() gives. Each seed states whether decode() accepts it (default limits);
// a seed that does not do what it says is an error, in both modes.
//   make_ps_wire_corpus DIR           write the seeds into DIR (created if missing)
//   make_ps_wire_corpus --check DIR   every seed is in DIR with the same bytes (other files
//                                     there are allowed: inputs kept by hand)
// "ok-" seeds decode, "bad-" seeds do not.
#include "ps_wire_input.hpp"

#include <gradus/comm/ps/wire.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace wire = gradus::ps::wire;
using bytes = std::vector<std::uint8_t>;

struct seed {
  std::string name;
  std::vector<bytes> frames;
  bool decodes;  // with the default limits
};

bytes of(const wire::header& h) {
  bytes b(sizeof h);
  std::memcpy(b.data(), &h, sizeof h);
  return b;
}
bytes of(std::string_view text) { return bytes(text.begin(), text.end()); }
template <class T>
bytes of(std::initializer_list<T> values) {
  bytes b(values.size() * sizeof(T));
  std::memcpy(b.data(), values.begin(), b.size());
  return b;
}
bytes cat(bytes a, const bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A header with its payload, payload_bytes set; a header alone when the payload is empty.
std::vector<bytes> msg(wire::header h, const bytes& payload = {}) {
  h.payload_bytes = payload.size();
  if (payload.empty()) return {of(h)};
  return {of(h), payload};
}
wire::header from(wire::header h, int rank, std::uint64_t id, std::uint64_t clock = 0, double scalar = 0) {
  h.rank = rank;
  h.id = id;
  h.clock = clock;
  h.scalar = scalar;
  return h;
}
// init's payload: u32 name length, the name, the values (the chief's) or nothing
bytes init_payload(std::string_view name, const bytes& values = {}) {
  const auto len = static_cast<std::uint32_t>(name.size());
  return cat(cat(of<std::uint32_t>({len}), of(name)), values);
}

std::vector<seed> seeds() {
  using wire::type, wire::make;
  using gradus::element_type;
  std::vector<seed> s;
  const auto ok = [&](std::string name, std::vector<bytes> frames) { s.push_back({"ok-" + std::move(name), std::move(frames), true}); };
  const auto bad = [&](std::string name, std::vector<bytes> frames) { s.push_back({"bad-" + std::move(name), std::move(frames), false}); };

  // What a worker sends.
  const auto hello = [](int rank, int world, const char* mode, int staleness) {
    nlohmann::json j;
    j["rank"] = rank;
    j["world_size"] = world;
    j["mode"] = mode;
    j["staleness"] = staleness;
    return of(j.dump());
  };
  ok("hello-bsp", msg(from(make(type::hello), 0, 1), hello(0, 2, "bsp", 0)));
  ok("hello-ssp", msg(from(make(type::hello), 1, 1), hello(1, 3, "ssp", 2)));
  const auto config = [](const char* opt, std::map<std::string, std::string> settings) {
    nlohmann::json j;
    j["optimizer"] = opt;
    j["settings"] = settings;
    return of(j.dump());
  };
  ok("config-sgd", msg(from(make(type::config), 0, 2), config("sgd", {{"momentum", "0.9"}, {"nesterov", "true"}, {"weight_decay", "0.0001"}})));
  ok("config-adamw", msg(from(make(type::config), 0, 2), config("adamw", {{"beta1", "0.9"}, {"beta2", "0.999"}, {"eps", "1e-08"}})));
  ok("init-chief-f32", msg(from(make(type::init, 0, 0, 4, element_type::f32), 0, 3, 0, 4), init_payload("dense/w", of<float>({0.5f, -1.f, 2.f, 0.25f}))));
  ok("init-worker-f64", msg(from(make(type::init, 1, 2, 3, element_type::f64), 1, 3, 0, 5), init_payload("dense/b")));
  ok("push-f32", msg(from(make(type::push, 0, 0, 4, element_type::f32), 1, 4, 3, 0.05), of<float>({0.1f, 0.2f, -0.3f, 0.f})));
  ok("push-f64", msg(from(make(type::push, 1, 2, 3, element_type::f64), 0, 5, 3, 0.05), of<double>({1e-3, -2e-3, 3.5})));
  ok("push-bf16", msg(from(make(type::push, 0, 0, 4, element_type::bf16), 1, 4, 3, 0.05), bytes{0x80, 0x3f, 0x00, 0xc0, 0x49, 0x40, 0, 0}));
  ok("push-f16", msg(from(make(type::push, 0, 0, 2, element_type::f16), 1, 4, 3, 0.05), bytes{0x00, 0x3c, 0x55, 0x35}));
  ok("push-f32-80", msg(from(make(type::push, 0, 0, 80, element_type::f32), 0, 6, 3, 0.05), bytes(320, 0x3f)));  // over the small limits
  ok("pull", msg(from(make(type::pull, 0, 1, 3, element_type::f32), 1, 7, 3)));
  ok("pull-empty-payload-frame", {of(from(make(type::pull, 1, 2, 3, element_type::f64), 0, 8, 4)), {}});
  ok("clock", msg(from(make(type::clock), 1, 9, 4)));
  ok("coll-sum-f32", msg(from(make(type::coll, 1, 0, 2, element_type::f32), 0, 10, 0), of<float>({1.f, 2.f})));
  ok("coll-average-f64", msg(from(make(type::coll, 2, 0, 2, element_type::f64), 1, 11, 1), of<double>({1.0, -2.0})));
  ok("coll-broadcast-bytes", msg(from(make(type::coll, 3, 1, 5, element_type::none), 1, 12, 2), of("hello")));
  ok("coll-barrier", msg(from(make(type::coll, 4), 0, 13, 3)));
  ok("snapshot", msg(from(make(type::snapshot, 0, 0, 4, element_type::f32), 0, 14)));
  ok("hello-rejoin", msg(from(make(type::hello), 1, 1), of(R"({"rank":1,"world_size":2,"mode":"bsp","staleness":0,"rejoin":true,"clock":104})")));
  ok("init-values-f32-with-state", msg(from(make(type::init_values, 0, 2, 2, element_type::f32), 0, 17, 0), of<float>({1.f, 2.f, 0.f, 0.f, 1.f, 1.f})));
  // rows of 3: indices 4 and 9, then their values
  ok("push-rows-f32", msg(from(make(type::push_rows, 0, 3, 2, element_type::f32), 1, 18, 5, 0.1),
                          cat(of<std::uint64_t>({4, 9}), of<float>({0.1f, 0.2f, 0.3f, -0.1f, -0.2f, -0.3f}))));
  ok("push-rows-none", msg(from(make(type::push_rows, 1, 3, 0, element_type::f64), 0, 19, 5, 0.1)));
  ok("pull-rows-since", msg(from(make(type::pull_rows, 0, 3, 12, element_type::f32), 1, 20, 6)));
  ok("bye", msg(from(make(type::bye), 1, 15)));
  ok("shutdown", msg(from(make(type::shutdown), 0, 16)));
  // What the server answers.
  ok("reply-pull", msg(from(make(type::reply, 0, 1, 2, element_type::f32), 1, 7, 3, 3), of<float>({0.5f, 0.75f})));
  ok("fail", msg(from(make(type::fail), 1, 4), of("gradus: parameter server 0: no shard with key 9 (init it first)")));
  // Payloads decode() passes and the server refuses.
  ok("hello-truncated-json", msg(from(make(type::hello), 0, 1), of(R"({"rank":0,"world_size":)")));
  ok("config-number-overflow", msg(from(make(type::config), 0, 2), of(R"({"optimizer":"sgd","settings":{"momentum":1e999}})")));
  ok("init-name-past-payload", msg(from(make(type::init, 0, 0, 1, element_type::f32), 0, 3, 0, 1), cat(of<std::uint32_t>({4096}), of("w"))));

  // Malformed: each of decode()'s reasons.
  bad("no-frames", {});
  bad("three-frames", {of(make(type::clock)), of("x"), of("y")});
  bytes short_header = of(make(type::clock));
  short_header.pop_back();
  bad("header-63-bytes", {short_header});
  bad("header-65-bytes", {cat(of(make(type::clock)), {0})});
  auto h = make(type::clock);
  h.magic ^= 1;
  bad("magic", msg(h));
  h = make(type::clock);
  h.version = 1;  // an older protocol
  bad("version-1", msg(h));
  h = make(type::clock);
  h.type = 0;
  bad("type-0", msg(h));
  h.type = wire::last_type + 1;
  bad("type-past-last", msg(h));
  h = make(type::pull, 0, 0, 1, element_type::f32);
  h.dtype = 4;
  bad("dtype-4", msg(h));
  h = make(type::push, 0, 0, 4, element_type::f32);
  h.payload_bytes = 20;
  bad("payload-bytes-mismatch", {of(h), bytes(16, 0)});
  bad("push-count-mismatch", msg(make(type::push, 0, 0, 5, element_type::f32), bytes(16, 0)));
  bad("pull-bf16", msg(make(type::pull, 0, 0, 4, element_type::bf16)));  // only a push carries two-byte floats
  bad("push-rows-short", msg(make(type::push_rows, 0, 3, 2, element_type::f32), bytes(39, 0)));
  bad("push-rows-row-of-0", msg(make(type::push_rows, 0, 0, 1, element_type::f32), bytes(8, 0)));
  bad("pull-rows-without-dtype", msg(make(type::pull_rows, 0, 3, 0)));
  bad("init-values-ragged", msg(make(type::init_values, 0, 0, 3, element_type::f64), bytes(30, 0)));
  bad("push-without-dtype", msg(make(type::push, 0, 0, 4), bytes(16, 0)));
  bad("push-empty-range", msg(make(type::push, 0, 0, 0, element_type::f32)));
  bad("pull-empty-range", msg(make(type::pull, 0, 0, 0, element_type::f32)));
  bad("coll-op-6", msg(make(type::coll, 6, 0, 1, element_type::f32), bytes(4, 0)));
  bad("coll-sum-count-mismatch", msg(make(type::coll, 1, 0, 1), bytes(4, 0)));  // none: 1 byte, not 4
  bad("count-over-limit", msg(make(type::pull, 0, 0, std::uint64_t(1) << 41, element_type::f32)));
  bad("range-past-limit", msg(make(type::pull, 0, (std::uint64_t(1) << 40) - 1, 2, element_type::f32)));
  return s;
}

// The seed does what its name says: decode() accepts it, or refuses it.
bool as_declared(const seed& s, const bytes& input) {
  const gradus::fuzz::message m(input);
  const auto r = wire::decode(m.frames());
  if (r.msg.has_value() == s.decodes) return true;
  std::fprintf(stderr, "make_ps_wire_corpus: seed %s %s\n", s.name.c_str(),
               s.decodes ? ("is refused: " + r.error).c_str() : "is accepted");
  return false;
}

bytes read(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  const bool check = argc == 3 && std::string_view(argv[1]) == "--check";
  if (argc != 2 + (check ? 1 : 0)) {
    std::fprintf(stderr, "usage: %s DIR | --check DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir(argv[argc - 1]);
  if (!check) std::filesystem::create_directories(dir);
  int wrong = 0;
  const auto all = seeds();
  for (const auto& s : all) {
    const bytes input = gradus::fuzz::encode(s.frames);
    if (!as_declared(s, input)) {
      ++wrong;
      continue;
    }
    const auto path = dir / s.name;
    if (check) {
      if (!std::filesystem::is_regular_file(path)) {
        std::fprintf(stderr, "make_ps_wire_corpus: %s is missing\n", path.c_str());
        ++wrong;
      } else if (read(path) != input) {
        std::fprintf(stderr, "make_ps_wire_corpus: %s differs from the seed it should hold\n", path.c_str());
        ++wrong;
      }
    } else {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(input.data()), static_cast<std::streamsize>(input.size()));
      if (!out) {
        std::fprintf(stderr, "make_ps_wire_corpus: cannot write %s\n", path.c_str());
        return 1;
      }
    }
  }
  if (wrong) {
    if (check) std::fprintf(stderr, "make_ps_wire_corpus: %d of %zu seeds are wrong or stale; regenerate with: %s %s\n", wrong, all.size(), argv[0], dir.c_str());
    return 1;
  }
  std::printf("make_ps_wire_corpus: %zu seeds %s %s\n", all.size(), check ? "match" : "written to", dir.c_str());
  return 0;
}
