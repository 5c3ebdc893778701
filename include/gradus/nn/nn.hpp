#pragma once
// Layers, losses and metrics.
#include "gradus/nn/dense.hpp"
#include "gradus/nn/losses.hpp"
