#pragma once
// gradus: machine-learning models as typed C++ expressions. This header is the DSL; it
// includes no SIMD, BLAS, CUDA or network library. Add a backend header, e.g.
// <gradus/backends/cpu_simd.hpp>, to evaluate.
#include "gradus/autodiff/autodiff.hpp"
#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/core/fixed_string.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/exec/dot.hpp"
#include "gradus/exec/graph.hpp"
#include "gradus/exec/node_registry.hpp"
#include "gradus/exec/plan.hpp"
#include "gradus/exec/session.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/node.hpp"
#include "gradus/graph/ops/elementwise.hpp"
#include "gradus/graph/ops/expand.hpp"
#include "gradus/graph/ops/index.hpp"
#include "gradus/graph/ops/matmul.hpp"
#include "gradus/graph/ops/reduce.hpp"
#include "gradus/graph/ops/shape_ops.hpp"
#include "gradus/graph/ops/softmax.hpp"
#include "gradus/train/train.hpp"
