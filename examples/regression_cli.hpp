#pragma once
// The command line the regression examples (linear_regression, logistic_regression,
// ridge_regression) share, written once:
//   - the program's CLI::App, with every option's default shown in --help;
//   - the options each takes after its own: --seed (its help text the example's), --threads,
//     --json, and the data-parallel options (comm_options.hpp);
//   - the run around the example's body: parse (a bad option or --help ends here, as
//     CLI11_PARSE does), let a parameter-server task serve and end (serve_if_ps), apply
//     --threads, and report an exception as "<program>: <what>" with exit status 1.
//
//   gradus_examples::regression_cli cli("What the example does.");
//   cli.app.add_option("--lr", lr, "learning rate");          // the example's own options
//   cli.add_shared_options("seed of the data and of the initial weights");
//   return cli.run("my_regression", argc, argv, [&] { ...; return 0; });
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include "cli_checks.hpp"
#include "comm_options.hpp"  // comm_options, serve_if_ps; set_threads (example_backend.hpp)

namespace gradus_examples {

struct regression_cli {
  CLI::App app;
  std::uint64_t seed = 42;
  int threads = 0;  // 0: OpenMP's default
  bool json = false;
  comm_options co;

  explicit regression_cli(std::string description) : app{std::move(description)} {
    app.option_defaults()->always_capture_default();
  }

  // --seed, --threads, --json and the data-parallel options, after the example's own (so
  // --help lists them last, in this order).
  void add_shared_options(const std::string& seed_help) {
    app.add_option("--seed", seed, seed_help)->check(seed_check);
    app.add_option("--threads", threads, "threads for fused passes and GEMM; 0 = OpenMP's default")
        ->check(non_negative);
    app.add_flag("--json", json, "print one line of JSON metrics instead of progress");
    add_comm_options(app, co);
  }

  // Parses the command line and runs body() (which returns the exit status) on a worker;
  // see the top.
  template <class Body>
  int run(const char* program, int argc, char** argv, Body&& body) {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    try {
      if (const auto rc = serve_if_ps(co)) return *rc;  // a ps task serves and ends
      if (threads > 0) set_threads(threads);
      return std::forward<Body>(body)();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", program, e.what());
      return 1;
    }
  }
};

}  // namespace gradus_examples
