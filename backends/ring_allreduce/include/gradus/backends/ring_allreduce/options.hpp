#pragma once
// How a ring_allreduce communicator finds its peers.
#include <chrono>
#include <cstddef>
#include <string>

namespace zmq {
class context_t;
}

namespace gradus {

struct ring_options {
  int rank = 0;
  int world_size = 1;
  // Where the ranks meet: rank 0 binds it, the others connect to it and register
  // (rank, data address, hostname); rank 0 answers with the whole table.
  //   "tcp://127.0.0.1:29500"      between processes or hosts
  //   "ipc:///tmp/gradus-job/rdv"  between processes on one host
  //   "inproc://job"               ranks as threads sharing `context`
  std::string rendezvous;
  // The data path: "tcp", "ipc", "inproc" or "auto" (the rendezvous' scheme; for a tcp
  // rendezvous, ipc when every rank reports the same hostname, else tcp).
  std::string transport = "auto";
  // The interface a tcp data socket binds (an ephemeral port). Default: rank 0 binds the
  // rendezvous' host; the others bind 127.0.0.1 when that host is a loopback address, else
  // every interface, advertising the local address that routes to rank 0 (or, without a
  // route, this host's name).
  std::string bind_host;
  // The longest any one wait may last (rendezvous, a message from a peer, a send to
  // complete). A dead peer whose connection drops is noticed within a few seconds instead.
  std::chrono::milliseconds timeout{30000};
  // Messages carry at most this many bytes: a collective streams segment by segment, so
  // sending, receiving and reducing overlap.
  std::size_t segment_bytes = std::size_t{1} << 20;
  // The ZeroMQ context to use (required for inproc://); null: the communicator owns one.
  zmq::context_t* context = nullptr;
  // Background I/O threads of an owned context.
  int io_threads = 1;
};

}  // namespace gradus
