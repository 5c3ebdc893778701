// cluster::from_env: every format (TF_CONFIG, torchrun, Slurm, OpenMPI, gradus JSON, none),
// the order in which they are tried, Slurm's hostlist syntax, and each malformed spec
// against the error it must raise (the variable and the field named). The environment is
// a map: nothing here touches the process environment.
#define BOOST_TEST_MODULE dist_cluster
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gradus/parallel/cluster.hpp>

namespace c = gradus::cluster;
using env = std::map<std::string, std::string>;
using strings = std::vector<std::string>;

namespace {

// from_env(e) must throw a gradus::error whose message contains every needle.
void expect_error(const env& e, const strings& needles) {
  try {
    const auto s = c::from_env(e);
    BOOST_ERROR("no error; got rank " << s.rank << " of " << s.world_size << " from " << s.source);
  } catch (const gradus::error& err) {
    const std::string msg = err.what();
    for (const auto& n : needles) BOOST_CHECK_MESSAGE(msg.find(n) != std::string::npos, "'" << msg << "' lacks '" << n << "'");
  }
}

const std::string tf_cluster =
    R"("cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222", "c0:2223"], "ps": ["p0:2222", "p1:2222"]})";

std::string tf(const std::string& task) { return "{" + tf_cluster + ", \"task\": " + task + "}"; }

}  // namespace

BOOST_AUTO_TEST_SUITE(formats)

BOOST_AUTO_TEST_CASE(default_is_a_world_of_one) {
  const auto s = c::from_env(env{{"HOME", "/root"}});
  BOOST_TEST(s.source == "default");
  BOOST_TEST(s.rank == 0);
  BOOST_TEST(s.world_size == 1);
  BOOST_TEST(s.local_rank == 0);
  BOOST_TEST(s.local_world_size == 1);
  BOOST_TEST(s.is_chief());
  BOOST_TEST(s.rendezvous() == "tcp://127.0.0.1:29500");
  BOOST_TEST(s.hosts.empty());
  BOOST_TEST(s.ps.empty());
}

BOOST_AUTO_TEST_CASE(tf_config_chief_workers_ps) {
  // The chief is rank 0 and the workers follow.
  auto s = c::from_env(env{{"TF_CONFIG", tf(R"({"type": "chief", "index": 0})")}});
  BOOST_TEST(s.source == "TF_CONFIG");
  BOOST_TEST(s.task_type == "chief");
  BOOST_TEST(s.rank == 0);
  BOOST_TEST(s.world_size == 4);
  BOOST_TEST(s.is_chief());
  BOOST_TEST(s.hosts == (strings{"c0:2222", "w0:2222", "w1:2222", "c0:2223"}), boost::test_tools::per_element());
  BOOST_TEST(s.ps == (strings{"p0:2222", "p1:2222"}), boost::test_tools::per_element());
  BOOST_TEST(s.master_addr == "c0");
  BOOST_TEST(s.master_port == 2222);
  BOOST_TEST(s.rendezvous() == "tcp://c0:2222");
  // host c0 carries ranks 0 and 3
  BOOST_TEST(s.local_rank == 0);
  BOOST_TEST(s.local_world_size == 2);

  s = c::from_env(env{{"TF_CONFIG", tf(R"({"type": "worker", "index": 2})")}});
  BOOST_TEST(s.task_type == "worker");
  BOOST_TEST(s.task_index == 2);
  BOOST_TEST(s.rank == 3);
  BOOST_TEST(!s.is_chief());
  BOOST_TEST(s.local_rank == 1);
  BOOST_TEST(s.local_world_size == 2);

  s = c::from_env(env{{"TF_CONFIG", tf(R"({"type": "worker", "index": 0})")}});
  BOOST_TEST(s.rank == 1);
  BOOST_TEST(s.local_rank == 0);
  BOOST_TEST(s.local_world_size == 1);

  s = c::from_env(env{{"TF_CONFIG", tf(R"({"type": "ps", "index": 1})")}});
  BOOST_TEST(s.task_type == "ps");
  BOOST_TEST(s.task_index == 1);
  BOOST_TEST(s.rank == -1);
  BOOST_TEST(!s.is_worker());
  BOOST_TEST(s.world_size == 4);
}

BOOST_AUTO_TEST_CASE(tf_config_as_tensorflow_writes_it) {
  // MultiWorkerMirroredStrategy's tutorial config: workers only, extra keys, evaluator.
  auto s = c::from_env(env{{"TF_CONFIG", R"({
      "cluster": {"worker": ["localhost:12345", "localhost:23456"]},
      "task": {"type": "worker", "index": 1}, "environment": "cloud", "rpc_layer": "grpc"})"}});
  BOOST_TEST(s.rank == 1);
  BOOST_TEST(s.world_size == 2);
  BOOST_TEST(s.master_addr == "localhost");
  BOOST_TEST(s.master_port == 12345);
  BOOST_TEST(s.local_rank == 1);
  BOOST_TEST(s.local_world_size == 2);
  // The evaluator sits outside the cluster and outside the world.
  s = c::from_env(env{{"TF_CONFIG", R"({"cluster": {"worker": ["w0:1", "w1:1"]}, "task": {"type": "evaluator", "index": 0}})"}});
  BOOST_TEST(s.task_type == "evaluator");
  BOOST_TEST(s.rank == -1);
  BOOST_TEST(s.world_size == 2);
  // Estimator-era names: "master" for the chief, an index written as a string.
  s = c::from_env(env{{"TF_CONFIG", R"({"cluster": {"master": ["m:1"], "worker": ["w0:1"]}, "task": {"type": "worker", "index": "0"}})"}});
  BOOST_TEST(s.rank == 1);
  BOOST_TEST(s.master_addr == "m");
  // {} says nothing (TensorFlow's single process): as if TF_CONFIG were not set, so the
  // next format is read.
  s = c::from_env(env{{"TF_CONFIG", "{}"}});
  BOOST_TEST(s.source == "default");
  BOOST_TEST(s.world_size == 1);
  s = c::from_env(env{{"TF_CONFIG", R"({"environment": "cloud"})"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}});
  BOOST_TEST(s.source == "torchrun");
  BOOST_TEST(s.rank == 1);
  // One worker and no task: that worker. IPv6 in brackets.
  s = c::from_env(env{{"TF_CONFIG", R"({"cluster": {"worker": ["[::1]:5000"]}})"}});
  BOOST_TEST(s.master_addr == "::1");
  BOOST_TEST(s.rendezvous() == "tcp://[::1]:5000");
}

BOOST_AUTO_TEST_CASE(torchrun) {
  const env e{{"RANK", "5"},        {"WORLD_SIZE", "8"},       {"LOCAL_RANK", "1"},    {"LOCAL_WORLD_SIZE", "4"},
              {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29400"}, {"GRADUS_PS", "p:7,q:8"}};
  const auto s = c::from_env(e);
  BOOST_TEST(s.source == "torchrun");
  BOOST_TEST(s.rank == 5);
  BOOST_TEST(s.world_size == 8);
  BOOST_TEST(s.local_rank == 1);
  BOOST_TEST(s.local_world_size == 4);
  BOOST_TEST(s.rendezvous() == "tcp://n0:29400");
  BOOST_TEST(s.task_type == "worker");
  BOOST_TEST(s.ps == (strings{"p:7", "q:8"}), boost::test_tools::per_element());
  // A world of one needs no master; the port defaults to torchrun's 29500.
  const auto one = c::from_env(env{{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  BOOST_TEST(one.rendezvous() == "tcp://127.0.0.1:29500");
  // gradus-run's parameter servers
  const auto ps = c::from_env(env{{"WORLD_SIZE", "2"},
                                  {"GRADUS_ROLE", "ps"},
                                  {"GRADUS_PS_INDEX", "1"},
                                  {"GRADUS_PS", "127.0.0.1:7001,127.0.0.1:7002"},
                                  {"MASTER_ADDR", "127.0.0.1"},
                                  {"MASTER_PORT", "7000"}});
  BOOST_TEST(ps.task_type == "ps");
  BOOST_TEST(ps.task_index == 1);
  BOOST_TEST(ps.rank == -1);
  BOOST_TEST(ps.world_size == 2);
  // a Kubernetes Indexed Job: the pod's JOB_COMPLETION_INDEX is the rank where RANK is not set
  const auto pod = c::from_env(env{{"JOB_COMPLETION_INDEX", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "train-0.train"}});
  BOOST_TEST(pod.source == "torchrun");
  BOOST_TEST(pod.rank == 2);
  BOOST_TEST(pod.task_index == 2);
  BOOST_TEST(pod.world_size == 3);
  BOOST_TEST(pod.rendezvous() == "tcp://train-0.train:29500");
  BOOST_TEST(c::from_env(env{{"RANK", "0"}, {"JOB_COMPLETION_INDEX", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "a"}}).rank == 0);
}

BOOST_AUTO_TEST_CASE(slurm) {
  env e{{"SLURM_PROCID", "3"},
        {"SLURM_NTASKS", "5"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_NODEID", "1"},
        {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"},
        {"SLURM_STEP_NODELIST", "node[01-02],gpu5"},
        {"SLURM_JOB_NODELIST", "other[1-9]"},
        {"SLURM_JOB_ID", "123456"}};
  auto s = c::from_env(e);
  BOOST_TEST(s.source == "slurm");
  BOOST_TEST(s.rank == 3);
  BOOST_TEST(s.world_size == 5);
  BOOST_TEST(s.local_rank == 1);
  BOOST_TEST(s.local_world_size == 2);
  BOOST_TEST(s.nodes == (strings{"node01", "node02", "gpu5"}), boost::test_tools::per_element());
  BOOST_TEST(s.master_addr == "node01");
  BOOST_TEST(s.master_port == 29500 + 123456 % 10000);
  // The job's node list when there is no step; the port from GRADUS_MASTER_PORT.
  e.erase("SLURM_STEP_NODELIST");
  e["GRADUS_MASTER_PORT"] = "4000";
  e["MASTER_PORT"] = "5000";
  s = c::from_env(e);
  BOOST_TEST(s.master_addr == "other1");
  BOOST_TEST(s.master_port == 4000);
  e.erase("GRADUS_MASTER_PORT");
  BOOST_TEST(c::from_env(e).master_port == 5000);
}

BOOST_AUTO_TEST_CASE(openmpi) {
  auto s = c::from_env(env{{"OMPI_COMM_WORLD_RANK", "2"},
                           {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  BOOST_TEST(s.source == "openmpi");
  BOOST_TEST(s.rank == 2);
  BOOST_TEST(s.world_size == 4);
  BOOST_TEST(s.local_rank == 0);
  BOOST_TEST(s.local_world_size == 2);
  BOOST_TEST(s.rendezvous() == "tcp://127.0.0.1:29500");
  s = c::from_env(env{{"OMPI_COMM_WORLD_RANK", "1"},
                      {"OMPI_COMM_WORLD_SIZE", "2"},
                      {"MASTER_ADDR", "a"},
                      {"MASTER_PORT", "1"},
                      {"GRADUS_MASTER_ADDR", "b"},
                      {"GRADUS_MASTER_PORT", "2"}});
  BOOST_TEST(s.rendezvous() == "tcp://b:2");
  s = c::from_env(env{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}});
  BOOST_TEST(s.rendezvous() == "tcp://a:1");
}

BOOST_AUTO_TEST_CASE(gradus_json_inline_and_file) {
  const std::string text = R"({"workers": ["h0:9000", "h1:9000", "h0:9001"], "ps": ["h2:9100"], "rank": 2})";
  auto s = c::from_env(env{{"GRADUS_CLUSTER", text}});
  BOOST_TEST(s.source == "gradus-json");
  BOOST_TEST(s.rank == 2);
  BOOST_TEST(s.world_size == 3);
  BOOST_TEST(s.local_rank == 1);
  BOOST_TEST(s.local_world_size == 2);
  BOOST_TEST(s.rendezvous() == "tcp://h0:9000");
  BOOST_TEST(s.ps == (strings{"h2:9100"}), boost::test_tools::per_element());
  // GRADUS_RANK / GRADUS_ROLE override the file: one file serves every process.
  s = c::from_env(env{{"GRADUS_CLUSTER", text}, {"GRADUS_RANK", "1"}});
  BOOST_TEST(s.rank == 1);
  s = c::from_env(env{{"GRADUS_CLUSTER", text}, {"GRADUS_RANK", "0"}, {"GRADUS_ROLE", "ps"}});
  BOOST_TEST(s.task_type == "ps");
  BOOST_TEST(s.rank == -1);
  BOOST_TEST(s.task_index == 0);

  const auto path = std::filesystem::temp_directory_path() / ("gradus_cluster." + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << R"({"workers": ["127.0.0.1:7000", "127.0.0.1:7001"], "role": "worker"})";
  s = c::from_env(env{{"GRADUS_CLUSTER", path.string()}, {"GRADUS_RANK", "1"}});
  BOOST_TEST(s.rank == 1);
  BOOST_TEST(s.world_size == 2);
  BOOST_TEST(s.local_world_size == 2);
  expect_error(env{{"GRADUS_CLUSTER", path.string()}}, {"GRADUS_CLUSTER file", path.string(), "rank missing", "GRADUS_RANK"});
  std::filesystem::remove(path);
  expect_error(env{{"GRADUS_CLUSTER", path.string()}}, {"GRADUS_CLUSTER", "cannot read", path.string()});
}

BOOST_AUTO_TEST_SUITE_END()

// The job id that keeps two jobs on one rendezvous port apart: gradus-run's, torchrun's
// run id, Slurm's job and step; none for ranks started by hand.
BOOST_AUTO_TEST_CASE(the_job_id_comes_from_the_launcher) {
  const env torch{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}};
  BOOST_TEST(c::from_env(torch).job_id == "");
  auto e = torch;
  e["TORCHELASTIC_RUN_ID"] = "abc";
  BOOST_TEST(c::from_env(e).job_id == "torchrun abc");
  e["GRADUS_JOB_ID"] = "gradus-run-7-29500";
  BOOST_TEST(c::from_env(e).job_id == "gradus-run-7-29500");
  const env slurm{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_ID", "42"}, {"SLURM_STEP_ID", "3"},
                  {"SLURM_JOB_NODELIST", "n1"}};
  BOOST_TEST(c::from_env(slurm).job_id == "slurm 42.3");
}

// Where master_addr and master_port came from, in each format, and how an error says it.
BOOST_AUTO_TEST_CASE(origins_of_the_master_address_and_port) {
  auto s = c::from_env(env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29400"}});
  BOOST_TEST(s.master_addr_from == "MASTER_ADDR");
  BOOST_TEST(s.master_port_from == "MASTER_PORT");
  BOOST_TEST(s.rendezvous_origin() == "MASTER_ADDR=localhost and MASTER_PORT=29400 (torchrun)");
  s = c::from_env(env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "n0"}});
  BOOST_TEST(s.master_port_from == "default 29500");
  BOOST_TEST(s.rendezvous_origin() == "MASTER_ADDR=n0 and the default port 29500 (torchrun)");

  s = c::from_env(env{{"TF_CONFIG", tf(R"({"type": "worker", "index": 1})")}});
  BOOST_TEST(s.master_addr_from == "TF_CONFIG cluster.chief[0]");
  BOOST_TEST(s.master_port_from == "TF_CONFIG cluster.chief[0]");
  BOOST_TEST(s.rendezvous_origin() == "TF_CONFIG cluster.chief[0] = c0:2222");
  s = c::from_env(env{{"TF_CONFIG", R"({"cluster": {"worker": ["localhost:12345", "localhost:23456"]}, "task": {"type": "worker", "index": 1}})"}});
  BOOST_TEST(s.rendezvous_origin() == "TF_CONFIG cluster.worker[0] = localhost:12345");
  s = c::from_env(env{{"TF_CONFIG", R"({"cluster": {"master": ["m:1"], "worker": ["w:1"]}, "task": {"type": "master"}})"}});
  BOOST_TEST(s.master_addr_from == "TF_CONFIG cluster.master[0]");

  s = c::from_env(env{{"GRADUS_CLUSTER", R"({"workers": ["[fd00::1]:7000", "b:7000"], "rank": 1})"}});
  BOOST_TEST(s.rendezvous_origin() == "GRADUS_CLUSTER workers[0] = [fd00::1]:7000");

  env slurm{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "node[01-02]"}, {"SLURM_JOB_ID", "1234"}};
  s = c::from_env(slurm);
  BOOST_TEST(s.master_addr_from == "SLURM_JOB_NODELIST (first node)");
  BOOST_TEST(s.master_port_from == "29500 + SLURM_JOB_ID mod 10000");
  BOOST_TEST(s.rendezvous_origin() ==
             "node01 from SLURM_JOB_NODELIST (first node) and port 30734 from 29500 + SLURM_JOB_ID mod 10000 (slurm)");
  slurm["MASTER_PORT"] = "29600";
  BOOST_TEST(c::from_env(slurm).master_port_from == "MASTER_PORT");
  slurm["GRADUS_MASTER_PORT"] = "29700";
  slurm["GRADUS_MASTER_ADDR"] = "head";
  s = c::from_env(slurm);
  BOOST_TEST(s.rendezvous_origin() == "GRADUS_MASTER_ADDR=head and GRADUS_MASTER_PORT=29700 (slurm)");
  slurm.erase("SLURM_JOB_ID");
  slurm.erase("MASTER_PORT");
  slurm.erase("GRADUS_MASTER_PORT");
  BOOST_TEST(c::from_env(slurm).master_port_from == "default 29500");

  s = c::from_env(env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  BOOST_TEST(s.rendezvous_origin() == "the default 127.0.0.1 and the default port 29500 (openmpi)");
  s = c::from_env(env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"GRADUS_MASTER_PORT", "1"}});
  BOOST_TEST(s.rendezvous_origin() == "MASTER_ADDR=h and GRADUS_MASTER_PORT=1 (openmpi)");

  s = c::from_env(env{});
  BOOST_TEST(s.rendezvous_origin() == "the default 127.0.0.1 and the default port 29500");
}

BOOST_AUTO_TEST_CASE(gradus_bind_addr) {
  // Every format takes it; it is passed on as it is (an address, an interface or "*").
  BOOST_TEST(c::from_env(env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "n0"}, {"GRADUS_BIND_ADDR", "10.0.0.5"}}).bind_addr == "10.0.0.5");
  BOOST_TEST(c::from_env(env{{"TF_CONFIG", tf(R"({"type": "chief"})")}, {"GRADUS_BIND_ADDR", "*"}}).bind_addr == "*");
  BOOST_TEST(c::from_env(env{{"GRADUS_CLUSTER", R"({"workers": ["a:1"]})"}, {"GRADUS_BIND_ADDR", "eth0"}}).bind_addr == "eth0");
  BOOST_TEST(c::from_env(env{{"GRADUS_BIND_ADDR", "::1"}}).bind_addr == "::1");
  BOOST_TEST(c::from_env(env{{"RANK", "0"}, {"WORLD_SIZE", "1"}}).bind_addr.empty());
  expect_error(env{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"GRADUS_BIND_ADDR", " "}}, {"GRADUS_BIND_ADDR is empty"});
}

BOOST_AUTO_TEST_SUITE(precedence)

BOOST_AUTO_TEST_CASE(tf_config_then_torchrun_then_slurm_then_openmpi_then_gradus_json) {
  env e{{"TF_CONFIG", tf(R"({"type": "worker", "index": 1})")},
        {"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "1"},
        {"OMPI_COMM_WORLD_RANK", "0"},
        {"OMPI_COMM_WORLD_SIZE", "1"},
        {"GRADUS_CLUSTER", R"({"workers": ["a:1"]})"}};
  const strings order{"TF_CONFIG", "torchrun", "slurm", "openmpi", "gradus-json", "default"};
  const std::vector<strings> vars{{"TF_CONFIG"},
                                  {"RANK", "WORLD_SIZE", "MASTER_ADDR"},
                                  {"SLURM_PROCID", "SLURM_NTASKS"},
                                  {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                  {"GRADUS_CLUSTER"}};
  for (std::size_t i = 0; i < order.size(); ++i) {
    BOOST_TEST(c::from_env(e).source == order[i]);
    if (i < vars.size())
      for (const auto& v : vars[i]) e.erase(v);
  }
  // An empty TF_CONFIG counts as absent (TensorFlow reads it as "{}").
  BOOST_TEST(c::from_env(env{{"TF_CONFIG", " "}, {"RANK", "0"}, {"WORLD_SIZE", "1"}}).source == "torchrun");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hostlists)

BOOST_AUTO_TEST_CASE(expansion) {
  BOOST_TEST(c::expand_hostlist("node[01-03,07],gpu5") == (strings{"node01", "node02", "node03", "node07", "gpu5"}),
             boost::test_tools::per_element());
  BOOST_TEST(c::expand_hostlist("a") == (strings{"a"}), boost::test_tools::per_element());
  BOOST_TEST(c::expand_hostlist("n[8-11]") == (strings{"n8", "n9", "n10", "n11"}), boost::test_tools::per_element());
  BOOST_TEST(c::expand_hostlist("n[098-101]") == (strings{"n098", "n099", "n100", "n101"}), boost::test_tools::per_element());
  BOOST_TEST(c::expand_hostlist("r[1-2]n[1-2]-ib,x") == (strings{"r1n1-ib", "r1n2-ib", "r2n1-ib", "r2n2-ib", "x"}),
             boost::test_tools::per_element());
  BOOST_TEST(c::expand_tasks_per_node("2(x3),1", "T") == (std::vector<int>{2, 2, 2, 1}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(malformed) {
  for (const char* bad : {"node[01-03", "node]", "node[]", "node[3-1]", "node[a-b]", "a,,b", "n[1-2[3]]", ",a", "n[1-]"}) {
    BOOST_TEST_CONTEXT(bad) {
      try {
        c::expand_hostlist(bad, "SLURM_STEP_NODELIST");
        BOOST_ERROR("no error");
      } catch (const gradus::error& e) {
        const std::string msg = e.what();
        BOOST_TEST(msg.find("SLURM_STEP_NODELIST") != std::string::npos);
        BOOST_TEST(msg.find(bad) != std::string::npos);
      }
    }
  }
  // through from_env
  expect_error(env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[1-2"}},
               {"SLURM_JOB_NODELIST = 'n[1-2'", "unclosed '['"});
}

// Found by tests/fuzz/fuzz_cluster (out of memory): 2^20 hosts was the only bound, so one
// bracket of many ranges made millions of suffixes before the count was checked, and long
// names times many hosts made gigabytes. Both are refused before the names are made.
BOOST_AUTO_TEST_CASE(expansions_bounded_before_they_are_made) {
  const auto refused = [](const std::string& list, const std::string& why) {
    try {
      c::expand_hostlist(list, "SLURM_JOB_NODELIST");
      BOOST_ERROR("no error for a list of " << list.size() << " characters");
    } catch (const gradus::error& e) {
      const std::string msg = e.what();
      BOOST_TEST(msg.starts_with("SLURM_JOB_NODELIST = '"), msg.substr(0, 40));
      BOOST_TEST(msg.ends_with("' is not a valid hostlist (" + why + ")"), msg.substr(0, 40));
    }
  };
  std::string ranges = "n[0-999999";
  for (int i = 0; i < 8; ++i) ranges += ",0-999999";
  refused(ranges + "]", "more than 2^20 hosts");
  refused(std::string(100, 'n') + "[0-999999]", "its names come to more than 2^24 bytes");  // 100 MB of names
  refused("n[0-999999]" + std::string(100, 'x'), "its names come to more than 2^24 bytes");
  BOOST_TEST(c::expand_hostlist("node[0-999999]").size() == 1000000u);  // a million short names still expand
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(malformed_specs)

BOOST_AUTO_TEST_CASE(tf_config) {
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 5}})"}},
               {"TF_CONFIG: task.index = 5 but cluster.worker has 2 entries"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}})"}},
               {"TF_CONFIG: task.index = 1 but cluster.worker has 1 entry"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}})"}},
               {"TF_CONFIG: task.index = 0 but cluster.ps has 0 entries"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "boss", "index": 0}})"}},
               {"TF_CONFIG: task.type = 'boss'"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"index": 0}})"}},
               {"TF_CONFIG: task.type missing"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:1"]}})"}}, {"TF_CONFIG: task missing"});
  // A task without a cluster, or an empty cluster: not a world of one (--comm ring would
  // train alone without a word).
  expect_error(env{{"TF_CONFIG", R"({"task": {"type": "worker", "index": 0}})"}}, {"TF_CONFIG: cluster missing (task is worker 0 of what?)"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": null, "task": {"type": "chief", "index": 0}})"}},
               {"TF_CONFIG: cluster missing (task is chief 0 of what?)"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {}, "task": {"type": "worker", "index": 1}})"}},
               {"TF_CONFIG: cluster is empty (task is worker 1 of what?)"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {}})"}}, {"TF_CONFIG: cluster is empty"});
  // and TF_CONFIG still wins over the formats after it
  expect_error(env{{"TF_CONFIG", R"({"task": {"type": "worker", "index": 0}})"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}},
               {"TF_CONFIG: cluster missing"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": -1}})"}},
               {"TF_CONFIG: task.index = -1"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": "x"}})"}},
               {"TF_CONFIG: task.index = \"x\" is not a non-negative integer"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b"]}, "task": {"type": "worker", "index": 0}})"}},
               {"TF_CONFIG: cluster.worker[1] = 'b' is not host:port"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:99999"]}, "task": {"type": "worker", "index": 0}})"}},
               {"cluster.worker[1] = 'b:99999'", "1-65535"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}})"}},
               {"TF_CONFIG: cluster.worker must be a list"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": [1]}, "task": {"type": "worker", "index": 0}})"}},
               {"TF_CONFIG: cluster.worker[0] = 1 is not"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}})"}},
               {"TF_CONFIG: cluster.chief has 2 entries (at most 1)"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}})"}},
               {"TF_CONFIG: cluster has no chief and no worker"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}})"}},
               {"TF_CONFIG: task.type = 'chief' but the cluster has no chief"});
  expect_error(env{{"TF_CONFIG", R"([1, 2])"}}, {"TF_CONFIG: must be a JSON object"});
  // bad JSON: the byte where parsing stopped
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1",]}})"}}, {"TF_CONFIG: invalid JSON at byte 31", "near '", "[\"a:1\",]'"});
}

BOOST_AUTO_TEST_CASE(torchrun) {
  expect_error(env{{"RANK", "x"}, {"WORLD_SIZE", "2"}}, {"RANK = 'x' is not an integer"});
  expect_error(env{{"RANK", "0"}}, {"WORLD_SIZE missing while RANK is set"});
  expect_error(env{{"WORLD_SIZE", "2"}}, {"RANK missing while WORLD_SIZE is set", "JOB_COMPLETION_INDEX gives it"});
  expect_error(env{{"JOB_COMPLETION_INDEX", "3"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "a"}},
               {"JOB_COMPLETION_INDEX = 3 but WORLD_SIZE = 3"});
  expect_error(env{{"JOB_COMPLETION_INDEX", "x"}, {"WORLD_SIZE", "3"}}, {"JOB_COMPLETION_INDEX = 'x' is not an integer"});
  expect_error(env{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}, {"RANK = 2 but WORLD_SIZE = 2"});
  expect_error(env{{"RANK", "-1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}, {"RANK = -1 is out of range"});
  expect_error(env{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE = 0 is out of range"});
  expect_error(env{{"RANK", "0"}, {"WORLD_SIZE", "2.5"}}, {"WORLD_SIZE = '2.5' is not an integer"});
  expect_error(env{{"RANK", "1"}, {"WORLD_SIZE", "2"}}, {"MASTER_ADDR missing while RANK is set"});
  expect_error(env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "http"}},
               {"MASTER_PORT = 'http' is not an integer"});
  expect_error(env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "0"}},
               {"MASTER_PORT = 0 is not a port"});
  expect_error(env{{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
               {"LOCAL_RANK = 2 but LOCAL_WORLD_SIZE = 2"});
  expect_error(env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"LOCAL_WORLD_SIZE", "3"}},
               {"LOCAL_WORLD_SIZE = 3 but WORLD_SIZE = 2"});
  expect_error(env{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"GRADUS_PS", "a:1,b"}}, {"GRADUS_PS[1] = 'b' is not host:port"});
  expect_error(env{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"GRADUS_ROLE", "boss"}}, {"GRADUS_ROLE = 'boss'"});
  expect_error(env{{"WORLD_SIZE", "1"}, {"GRADUS_ROLE", "ps"}, {"GRADUS_PS", "a:1"}}, {"GRADUS_PS_INDEX missing"});
  expect_error(env{{"WORLD_SIZE", "1"}, {"GRADUS_ROLE", "ps"}, {"GRADUS_PS_INDEX", "1"}, {"GRADUS_PS", "a:1"}},
               {"GRADUS_PS_INDEX = 1 but GRADUS_PS has 1 entry"});
}

BOOST_AUTO_TEST_CASE(slurm) {
  expect_error(env{{"SLURM_PROCID", "two"}, {"SLURM_NTASKS", "2"}}, {"SLURM_PROCID = 'two' is not an integer"});
  expect_error(env{{"SLURM_PROCID", "0"}}, {"SLURM_NPROCS missing while SLURM_PROCID"});
  expect_error(env{{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a"}},
               {"SLURM_PROCID = 2 but SLURM_NTASKS = 2"});
  expect_error(env{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}, {"SLURM_STEP_NODELIST and SLURM_JOB_NODELIST missing"});
  expect_error(env{{"SLURM_PROCID", "1"},
                   {"SLURM_NTASKS", "2"},
                   {"SLURM_JOB_NODELIST", "a"},
                   {"SLURM_NODEID", "0"},
                   {"SLURM_TASKS_PER_NODE", "2(3)"}},
               {"SLURM_TASKS_PER_NODE = '2(3)' is not a tasks-per-node list"});
  expect_error(env{{"SLURM_PROCID", "1"},
                   {"SLURM_NTASKS", "2"},
                   {"SLURM_JOB_NODELIST", "a"},
                   {"SLURM_NODEID", "3"},
                   {"SLURM_TASKS_PER_NODE", "2"}},
               {"SLURM_NODEID = 3 but SLURM_TASKS_PER_NODE = '2' lists 1 nodes"});
  expect_error(env{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a"}, {"GRADUS_MASTER_PORT", "-5"}},
               {"GRADUS_MASTER_PORT = -5 is not a port"});
}

BOOST_AUTO_TEST_CASE(openmpi) {
  expect_error(env{{"OMPI_COMM_WORLD_RANK", "0"}}, {"OMPI_COMM_WORLD_SIZE missing while OMPI_COMM_WORLD_RANK is set"});
  expect_error(env{{"OMPI_COMM_WORLD_SIZE", "2"}}, {"OMPI_COMM_WORLD_RANK missing while OMPI_COMM_WORLD_SIZE is set"});
  expect_error(env{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
               {"OMPI_COMM_WORLD_RANK = 3 but OMPI_COMM_WORLD_SIZE = 2"});
  expect_error(env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "z"}},
               {"OMPI_COMM_WORLD_LOCAL_RANK = 'z' is not an integer"});
}

BOOST_AUTO_TEST_CASE(gradus_json) {
  expect_error(env{{"GRADUS_CLUSTER", R"({"worker": ["a:1"], "rank": 0})"}},
               {"GRADUS_CLUSTER: unknown key 'worker' (expected workers, ps, role, rank)"});
  expect_error(env{{"GRADUS_CLUSTER", R"({"rank": 0})"}}, {"GRADUS_CLUSTER: workers missing"});
  expect_error(env{{"GRADUS_CLUSTER", R"({"workers": []})"}}, {"GRADUS_CLUSTER: workers is empty"});
  expect_error(env{{"GRADUS_CLUSTER", R"({"workers": ["a:1", "b:1"], "rank": 2})"}},
               {"GRADUS_CLUSTER: rank = 2 but workers has 2 entries"});
  expect_error(env{{"GRADUS_CLUSTER", R"({"workers": ["a:1", "b:1"]})"}, {"GRADUS_RANK", "7"}},
               {"GRADUS_RANK = 7 but workers has 2 entries"});
  expect_error(env{{"GRADUS_CLUSTER", R"({"workers": ["a:1", "b:1"]})"}}, {"GRADUS_CLUSTER: rank missing"});
  expect_error(env{{"GRADUS_CLUSTER", R"({"workers": ["a:1"], "ps": ["p"], "rank": 0})"}}, {"GRADUS_CLUSTER: ps[0] = 'p'"});
  expect_error(env{{"GRADUS_CLUSTER", R"({"workers": ["a:1"], "role": "chief", "rank": 0})"}},
               {"GRADUS_CLUSTER: role = \"chief\" is not"});
  expect_error(env{{"GRADUS_CLUSTER", R"({"workers": ["a:1"], "role": "ps", "rank": 0})"}},
               {"GRADUS_CLUSTER: rank = 0 but ps has 0 entries"});
  expect_error(env{{"GRADUS_CLUSTER", R"({"workers": ["a:1"], "rank": 0)"}}, {"GRADUS_CLUSTER: invalid JSON at byte"});
  expect_error(env{{"GRADUS_CLUSTER", ""}}, {"GRADUS_CLUSTER is empty"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(endpoints) {
  BOOST_TEST(c::parse_endpoint("h:80", "x").str() == "h:80");
  BOOST_TEST(c::parse_endpoint("[fe80::1]:80", "x").host == "fe80::1");
  for (const char* bad : {"h", ":80", "h:", "h:0", "h:65536", "fe80::1:80", "[::1:80", "[::1]80"}) {
    BOOST_TEST_CONTEXT(bad) { BOOST_CHECK_THROW(c::parse_endpoint(bad, "x"), gradus::error); }
  }
}

// Found with tests/fuzz/fuzz_cluster, whose inputs check what the readers give back (each
// against a crafted input the fuzzer had not reached in its runs).
BOOST_AUTO_TEST_CASE(fuzz_cluster_findings) {
  // A bracket inside a host: "[[x]:1" read as host "[x", which str() wrote "[x:1", an
  // endpoint that does not read back (GRADUS_PS kept it; TF_CONFIG then failed on its own str()).
  expect_error(env{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"GRADUS_PS", "[[x]:1"}},
               {"GRADUS_PS[0] = '[[x]:1' is not host:port ('[' or ']' inside the host)"});
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["[[x]:1"]}})"}},
               {"TF_CONFIG: cluster.worker[0] = '[[x]:1' is not host:port ('[' or ']' inside the host)"});
  BOOST_CHECK_THROW(c::parse_endpoint("a]:1", "x"), gradus::error);
  // A number beyond a double's range threw nlohmann's out_of_range past parse_json's catch.
  expect_error(env{{"TF_CONFIG", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1e999}})"}},
               {"TF_CONFIG: invalid JSON, a number out of range:", "number overflow parsing '1e999'"});
  expect_error(env{{"GRADUS_CLUSTER", R"({"workers": ["a:1"], "rank": 1e400})"}},
               {"GRADUS_CLUSTER: invalid JSON, a number out of range:"});
  // SLURM_JOB_ID above 2^31 - 1 was cut to an int: 2147483648 gave port 25852, not 29500 + 3648.
  const auto slurm = c::from_env(env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_ID", "2147483648"}});
  BOOST_TEST(slurm.master_port == 29500 + 3648);
  BOOST_TEST(c::from_env(env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_ID", "4294967295"}}).master_port ==
             29500 + 7295);
  // An empty GRADUS_MASTER_ADDR or MASTER_ADDR made an empty master address under Slurm and
  // Open MPI (torchrun refused it already).
  expect_error(env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"GRADUS_MASTER_ADDR", ""}}, {"GRADUS_MASTER_ADDR is empty"});
  expect_error(env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"MASTER_ADDR", ""}}, {"MASTER_ADDR is empty"});
  expect_error(env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"GRADUS_MASTER_ADDR", ""}},
               {"GRADUS_MASTER_ADDR is empty"});
}
