#define BOOST_TEST_MODULE util_trace
// The trace recorder: Chrome Trace Event JSON that a JSON parser reads back (nlohmann_json
// here, independent of the writer), spans nested in time on their thread with their
// arguments, the process and thread names, flow events between threads, the ring buffer
// over steps, a file that is whole after every flush while another thread records, and
// errors naming the file.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <gradus/util/trace.hpp>

namespace gu = gradus::util;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
struct temp_dir {
  fs::path p = fs::temp_directory_path() / ("gradus_trace_" + std::to_string(::getpid()));
  temp_dir() { fs::create_directories(p); }
  ~temp_dir() { fs::remove_all(p); }
};
json read_json(const fs::path& f) {
  std::ifstream in(f);
  std::stringstream b;
  b << in.rdbuf();
  return json::parse(b.str());  // throws on anything but one whole JSON value
}
/// the events of phase `ph` named `name`
std::vector<json> events(const json& t, const std::string& ph, const std::string& name = "") {
  std::vector<json> r;
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == ph && (name.empty() || e.at("name") == name)) r.push_back(e);
  return r;
}
}  // namespace

BOOST_AUTO_TEST_CASE(spans_nest_on_their_thread_with_their_arguments_and_names) {
  temp_dir d;
  {
    gu::trace_recorder rec({.path = d.p / "t.json", .rank = 3});
    const gu::trace_install on(rec);
    rec.name_thread("main");
    {
      gu::trace_span outer("step", "train");
      outer.arg("step", 7);
      {
        gu::trace_span inner("allreduce", "comm");
        inner.arg("bytes", std::size_t{4096}).arg("peer", "rank 1").arg("ratio", 0.5).arg("odd \"name\"\n", true);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
  }  // the destructor writes the file
  const json t = read_json(d.p / "t.json");
  const auto pname = events(t, "M", "process_name");
  BOOST_REQUIRE_EQUAL(pname.size(), 1u);
  BOOST_TEST(pname[0].at("args").at("name") == "rank 3");
  BOOST_TEST(pname[0].at("pid") == 3);
  const auto tname = events(t, "M", "thread_name");
  BOOST_REQUIRE_EQUAL(tname.size(), 1u);
  BOOST_TEST(tname[0].at("args").at("name") == "main");

  const auto outer = events(t, "X", "step"), inner = events(t, "X", "allreduce");
  BOOST_REQUIRE_EQUAL(outer.size(), 1u);
  BOOST_REQUIRE_EQUAL(inner.size(), 1u);
  BOOST_TEST(outer[0].at("cat") == "train");
  BOOST_TEST(inner[0].at("cat") == "comm");
  BOOST_TEST(outer[0].at("pid") == 3);
  BOOST_TEST(inner[0].at("tid") == outer[0].at("tid"));
  BOOST_TEST(inner[0].at("tid") == tname[0].at("tid"));
  const double ots = outer[0].at("ts"), odur = outer[0].at("dur");
  const double its = inner[0].at("ts"), idur = inner[0].at("dur");
  BOOST_TEST(idur >= 2000);  // the 2 ms sleep, in microseconds
  BOOST_TEST(its >= ots);
  BOOST_TEST(its + idur <= ots + odur);
  BOOST_TEST(outer[0].at("args").at("step") == 7);
  const json& a = inner[0].at("args");
  BOOST_TEST(a.at("bytes") == 4096);
  BOOST_TEST(a.at("peer") == "rank 1");
  BOOST_TEST(a.at("ratio") == 0.5);
  BOOST_TEST(a.at("odd \"name\"\n") == true);
  BOOST_TEST(t.at("otherData").at("rank") == 3);
  BOOST_TEST(t.at("otherData").at("clock_origin_unix_us").get<std::int64_t>() > 1'600'000'000'000'000);
}

BOOST_AUTO_TEST_CASE(without_a_recorder_spans_record_nothing_and_installs_nest) {
  BOOST_TEST(gu::active_trace() == nullptr);
  { gu::trace_span s("nothing"); BOOST_TEST(!s.on()); }
  temp_dir d;
  gu::trace_recorder a({.path = d.p / "a.json"}), b({.path = d.p / "b.json"});
  {
    const gu::trace_install on_a(a);
    { gu::trace_span s("into a"); BOOST_TEST(s.on()); }
    {
      const gu::trace_install on_b(b);
      gu::trace_span s("into b");
    }
    BOOST_TEST(gu::active_trace() == &a);
    gu::trace_span s("into a again");
  }
  BOOST_TEST(gu::active_trace() == nullptr);
  { gu::trace_span s("nothing again"); }
  BOOST_TEST(a.size() == 2u);
  BOOST_TEST(b.size() == 1u);
  a.flush();
  const json t = read_json(d.p / "a.json");
  BOOST_TEST(events(t, "X", "into a").size() == 1u);
  BOOST_TEST(events(t, "X", "into a again").size() == 1u);
  BOOST_TEST(events(t, "X", "into b").empty());
  BOOST_TEST(t.at("traceEvents")[0].at("args").at("name") == "rank 0");
}

BOOST_AUTO_TEST_CASE(the_ring_buffer_keeps_the_last_steps_only) {
  temp_dir d;
  gu::trace_recorder rec({.path = d.p / "t.json", .keep_steps = 3, .flush_interval_s = 1e9});
  const gu::trace_install on(rec);
  for (int step = 0; step < 10; ++step) {
    rec.begin_step(step);
    const std::string name = "step " + std::to_string(step);
    gu::trace_span a(name, "train");
    gu::trace_span b("forward", "compute");
  }
  BOOST_TEST(rec.size() == 6u);  // two spans in each of steps 7, 8, 9
  rec.flush();
  const json t = read_json(d.p / "t.json");
  std::set<std::string> kept;
  for (const auto& e : events(t, "X")) kept.insert(e.at("name").get<std::string>());
  BOOST_TEST((kept == std::set<std::string>{"step 7", "step 8", "step 9", "forward"}));
  BOOST_TEST(events(t, "X", "forward").size() == 3u);
  BOOST_TEST(t.at("otherData").at("steps_seen") == 10);
  BOOST_TEST(t.at("otherData").at("last_step") == 9);
}

BOOST_AUTO_TEST_CASE(flows_join_a_send_on_one_thread_to_its_receive_on_another) {
  temp_dir d;
  gu::trace_recorder rec({.path = d.p / "t.json"});
  const gu::trace_install on(rec);
  std::int64_t sent_at = 0;
  std::thread sender([&] {
    rec.name_thread("sender");
    gu::trace_span s("send", "transfer");
    sent_at = rec.now_ns();
    rec.flow_start("activations", "transfer", 42, sent_at);
  });
  sender.join();
  {
    gu::trace_span r("receive", "transfer");
    rec.flow_end("activations", "transfer", 42, rec.now_ns());
  }
  rec.flush();
  const json t = read_json(d.p / "t.json");
  const auto s = events(t, "s"), f = events(t, "f");
  BOOST_REQUIRE_EQUAL(s.size(), 1u);
  BOOST_REQUIRE_EQUAL(f.size(), 1u);
  BOOST_TEST(s[0].at("id") == 42);
  BOOST_TEST(f[0].at("id") == 42);
  BOOST_TEST(f[0].at("bp") == "e");
  BOOST_TEST(s[0].at("ts").get<double>() == static_cast<double>(sent_at) / 1000, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(f[0].at("ts").get<double>() >= s[0].at("ts").get<double>());
  BOOST_TEST(s[0].at("tid") != f[0].at("tid"));
  BOOST_TEST(s[0].at("tid") == events(t, "X", "send")[0].at("tid"));
  BOOST_TEST(f[0].at("tid") == events(t, "X", "receive")[0].at("tid"));
}

BOOST_AUTO_TEST_CASE(the_file_is_whole_after_every_flush_while_another_thread_records) {
  temp_dir d;
  const fs::path file = d.p / "t.json";
  gu::trace_recorder rec({.path = file, .keep_steps = 5, .flush_interval_s = 0});
  const gu::trace_install on(rec);
  std::atomic<bool> stop{false};
  std::atomic<int> credits{0};  // spans the worker may record: 50 a step, so files stay small
  std::thread worker([&] {      // (under ASan with full unwinding at every malloc, as CI runs it)
    for (int i = 0; i < 100000 && !stop.load();) {
      if (credits.load() <= 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      --credits;
      gu::trace_span s("work", "compute");
      s.arg("i", i++);
    }
  });
  std::size_t most = 0;
  for (int step = 0; step < 30; ++step) {
    credits += 50;
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // the worker records meanwhile
    rec.begin_step(step);  // flush_interval_s 0: every step boundary writes the file
    const json t = read_json(file);
    BOOST_TEST(t.at("otherData").at("last_step") == step);
    most = std::max(most, t.at("traceEvents").size());
  }
  stop = true;
  worker.join();
  BOOST_TEST(most > 3u);  // the worker's spans were there to write
  for (const auto& e : fs::directory_iterator(d.p))  // no temporary left beside it
    BOOST_TEST(e.path().filename() == "t.json");
}

BOOST_AUTO_TEST_CASE(errors_name_the_file_and_what_to_do) {
  auto message_of = [](auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string no_path = message_of([] { gu::trace_recorder r({}); });
  BOOST_TEST(no_path.find("no file named for the trace") != std::string::npos, no_path);
  const std::string no_steps = message_of([] { gu::trace_recorder r({.path = "x.json", .keep_steps = 0}); });
  BOOST_TEST(no_steps.find("keep_steps is 0") != std::string::npos, no_steps);
  temp_dir d;
  const fs::path missing = d.p / "no_such_dir" / "t.json";
  gu::trace_recorder rec({.path = missing});
  const std::string m = message_of([&] { rec.flush(); });
  BOOST_TEST(m.find(missing.string()) != std::string::npos, m);
  BOOST_TEST(m.find("directory") != std::string::npos, m);
  BOOST_TEST(!fs::exists(missing.parent_path()));
}

BOOST_AUTO_TEST_CASE(names_with_quotes_and_control_characters_read_back_unchanged) {
  const std::string odd = std::string("a \"b\" \\ c\n\t") + char(1) + "é";
  const json j = json::parse(gu::json_quoted(odd));
  BOOST_TEST(j.get<std::string>() == odd);
}

BOOST_AUTO_TEST_CASE(times_are_written_in_microseconds_to_the_nanosecond) {
  temp_dir d;
  gu::trace_recorder rec({.path = d.p / "t.json"});
  rec.complete("a", "c", 1'234'567, 5);
  rec.complete("b", "c", 42, 1'000'000);
  rec.flush();
  const std::string text = [&] {
    std::ifstream in(d.p / "t.json");
    std::stringstream b;
    b << in.rdbuf();
    return b.str();
  }();
  BOOST_TEST(text.find("\"ts\":1234.567,") != std::string::npos);
  BOOST_TEST(text.find("\"dur\":0.005") != std::string::npos);
  BOOST_TEST(text.find("\"ts\":0.042,") != std::string::npos);
  BOOST_TEST(text.find("\"dur\":1000.000") != std::string::npos);
  const json t = json::parse(text);
  BOOST_TEST(events(t, "X", "a")[0].at("ts").get<double>() == 1234.567, boost::test_tools::tolerance(1e-9));
}
