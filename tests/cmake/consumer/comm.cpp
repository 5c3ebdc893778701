// The communicators through the installed package: the new header paths and targets
// (gradus::ring, gradus::ps), the old ones kept for one release (gradus/backends/*.hpp,
// gradus::ring_allreduce, gradus::zmq_ps, gradus::dist), and the communicator concept.
#include <gradus/backends/ring_allreduce.hpp>
#include <gradus/backends/zmq_ps.hpp>
#include <gradus/comm/ps.hpp>
#include <gradus/comm/ring.hpp>
#include <gradus/parallel/communicator.hpp>

static_assert(gradus::parallel::communicator<gradus::ring_allreduce>);
static_assert(gradus::dist::communicator<gradus::parameter_server<>>);
static_assert(gradus::parallel::parameter_server_policy<gradus::parameter_server<gradus::ps_bsp>>);

int comm_world_of_one() {
  gradus::parallel::local one;
  return one.world_size();
}
