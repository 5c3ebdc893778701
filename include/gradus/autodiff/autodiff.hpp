#pragma once
// grad() and every derivative rule.
#include "gradus/autodiff/grad.hpp"
#include "gradus/autodiff/rules/conv.hpp"
#include "gradus/autodiff/rules/elementwise.hpp"
#include "gradus/autodiff/rules/kernels.hpp"
#include "gradus/autodiff/rules/placement.hpp"
#include "gradus/autodiff/rules/rnn.hpp"
