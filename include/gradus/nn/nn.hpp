#pragma once
// Layers, losses and metrics, and the initializers that give the layers' variables their
// first value.
#include "gradus/nn/conv.hpp"
#include "gradus/nn/batch_norm.hpp"
#include "gradus/nn/dense.hpp"
#include "gradus/nn/dropout.hpp"
#include "gradus/nn/embedding.hpp"
#include "gradus/nn/init.hpp"
#include "gradus/nn/losses.hpp"
#include "gradus/nn/rnn.hpp"
