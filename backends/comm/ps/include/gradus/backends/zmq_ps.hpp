#pragma once
// The old path of gradus/comm/ps.hpp, gradus::parameter_server and gradus::ps::serve (target gradus::ps), kept for one release (0.1.x):
// include <gradus/comm/ps.hpp>.
#include "gradus/comm/ps.hpp"
