#pragma once
// The old path of gradus/comm/ring.hpp, gradus::ring_allreduce (target gradus::ring), kept for one release (0.1.x):
// include <gradus/comm/ring.hpp>.
#include "gradus/comm/ring.hpp"
