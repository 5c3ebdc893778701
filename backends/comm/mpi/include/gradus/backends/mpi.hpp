#pragma once
// The old path of gradus/comm/mpi.hpp, gradus::mpi_allreduce (target gradus::mpi), kept for one release (0.1.x):
// include <gradus/comm/mpi.hpp>.
#include "gradus/comm/mpi.hpp"
