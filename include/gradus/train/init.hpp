#pragma once
// Kept for one release: the initializers moved to gradus/nn/init.hpp; include that instead.
#include "gradus/nn/init.hpp"
