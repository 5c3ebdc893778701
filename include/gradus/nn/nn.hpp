#pragma once
// Layers, losses and metrics.
#include "gradus/nn/conv.hpp"
#include "gradus/nn/batch_norm.hpp"
#include "gradus/nn/dense.hpp"
#include "gradus/nn/dropout.hpp"
#include "gradus/nn/embedding.hpp"
#include "gradus/nn/losses.hpp"
#include "gradus/nn/rnn.hpp"
