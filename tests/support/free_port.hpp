#pragma once
// A loopback TCP port nobody listens on right now, for a rendezvous address in the
// communicator tests (data ports are ephemeral): gradus-run's own pick (tools/gradus-run/
// ports.hpp says why it comes from below the kernel's ephemeral range).
// tests/support/free_port.py is the same for the scripts.
#include "../../tools/gradus-run/ports.hpp"

namespace gradus_test {

inline int free_port() { return gradus_run::free_ports(1)[0]; }

}  // namespace gradus_test
