// gradus-keygen: writes CURVE key pairs for the parameter server's encryption and adds
// public keys to a server's allow-list. See README.md for a whole job's set-up.
//
//   gradus-keygen [--force] <name>                          <name>.key (0600) and <name>.pub
//   gradus-keygen --allow <name>.pub --rank R --list allow.txt   adds "<key> R" to allow.txt
//
// Exit status: 0 done, 1 refused or failed (the reason on stderr), 2 a usage error.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include <sys/stat.h>

#include "gradus/comm/net/curve.hpp"

namespace net = gradus::net;

namespace {

int write_pair(const std::string& name, bool force) {
  const std::string prefix = net::key_prefix(name);
  const auto kp = net::generate_key_pair();
  net::save_key_pair(prefix, kp, force);
  std::printf("gradus-keygen: wrote %s.key (the key pair: secret, mode 0600) and %s.pub (the public key)\n", prefix.c_str(), prefix.c_str());
  std::printf("public key: %s\n", kp.public_key.c_str());
  return 0;
}

// Adds the key of `pub_file` for `rank_text` to the allow-list `list` (written anew,
// atomically; created when missing). A key already listed is refused.
int allow(const std::string& pub_file, const std::string& rank_text, const std::string& list) {
  const std::string key = net::load_public_key(pub_file);
  int rank = net::any_rank;
  if (rank_text != "*") {
    const auto p = net::allow_list::parse(key + " " + rank_text + "\n", "--rank");  // the file format's own check
    rank = *p.rank_of(key);
  }
  std::string text;
  mode_t mode = 0644;
  struct stat st {};
  if (::stat(list.c_str(), &st) == 0) {
    text = net::detail_security::read_file(list, "allow-list");
    mode = st.st_mode & 07777;
    const auto existing = net::allow_list::parse(text, list);
    if (const auto r = existing.rank_of(key))
      throw gradus::error("gradus-keygen: the key of '" + pub_file + "' is already in '" + list + "' (rank " +
                          (*r == net::any_rank ? std::string("*") : std::to_string(*r)) + "); edit the file to change it");
    if (!text.empty() && text.back() != '\n') text += '\n';
  } else {
    text = "# gradus parameter-server allow-list: \"<public key> <rank>\" per line, rank * = any rank.\n"
           "# Read by ps tasks from GRADUS_PS_CURVE_ALLOW; gradus-keygen --allow adds lines.\n";
  }
  const auto slash = pub_file.rfind('/');
  text += net::allow_list::line(key, rank, pub_file.substr(slash == std::string::npos ? 0 : slash + 1));
  (void)net::allow_list::parse(text, list);  // what is written reads back
  net::detail_security::write_file_atomically(list, text, mode, /*overwrite=*/true);
  std::printf("gradus-keygen: %s may now connect as %s (%s)\n", pub_file.c_str(),
              rank == net::any_rank ? "any rank" : ("worker " + std::to_string(rank)).c_str(), list.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "gradus-keygen: CURVE key pairs and allow-lists for gradus' parameter server.\n"
      "  gradus-keygen [--force] <name>        writes <name>.key (the key pair, mode 0600) and <name>.pub\n"
      "  gradus-keygen --allow <name>.pub --rank R --list allow.txt\n"
      "                                        lets that key connect as worker R (* = any rank)\n"
      "See tools/gradus-keygen/README.md for a job's set-up."};
  std::string name, pub_file, rank_text, list;
  bool force = false;
  auto* name_opt = app.add_option("name", name, "the key pair's file prefix: <name>.key and <name>.pub");
  app.add_flag("-f,--force", force, "replace <name>.key and <name>.pub when they exist");
  auto* allow_opt = app.add_option("--allow", pub_file, "a public key file (<name>.pub) to add to the allow-list --list");
  auto* rank_opt = app.add_option("--rank", rank_text, "with --allow: the worker rank that key may act as, or * for any rank");
  auto* list_opt = app.add_option("--list", list, "with --allow: the allow-list file (created when missing)");
  allow_opt->needs(rank_opt)->needs(list_opt)->excludes(name_opt);
  rank_opt->needs(allow_opt);
  list_opt->needs(allow_opt);
  try {
    app.parse(argc, argv);
    if (pub_file.empty() && name.empty()) throw CLI::RequiredError("<name> (or --allow)");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return pub_file.empty() ? write_pair(name, force) : allow(pub_file, rank_text, list);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
