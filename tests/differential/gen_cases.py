#!/usr/bin/env python3
"""Writes a Boost.Test translation unit of random gradus expressions (differential tests).

Each case is a random scalar loss over a few variables, built from every op family:
elementwise maps (in their domains), binary ops with broadcasting, where, reductions over
an axis or all axes, max/min with and without ties (ties made by broadcasting, where the
function is differentiable along the tie), matmul chains with transposes, softmax,
log_softmax and cross-entropy, shared subexpressions, and (image cases) conv2d with
pooling. Shapes' last extents are and are not multiples of the SIMD width. The case is
checked by check_case.hpp: gradients against central finite differences in double, and
the float expression against the double one.

    gen_cases.py --seed S --cases K --out FILE.cpp

The same seed always writes the same file. A failing case prints its seed, index and
expression (docs/testing.md: hunting with fresh seeds).
"""
import argparse
import random

ROWS = [2, 3, 4]
COLS = [3, 5, 8, 16, 17]  # all-tail, around W, bodies with and without a tail
INNER = [2, 3, 7]

UNARY = [
    ("-({})", None), ("g::exp(g::tanh({}))", None), ("g::log(g::square({}) + 1.0)", None),
    ("g::log1p(g::square({}))", None), ("g::sqrt(g::square({}) + 0.5)", None),
    ("g::rsqrt(g::square({}) + 0.5)", None), ("g::abs({})", None), ("g::square({})", None),
    ("g::tanh({})", None), ("g::sigmoid({})", None), ("g::relu({})", None), ("g::softplus({})", None),
    ("g::leaky_relu({}, 0.1)", None), ("g::elu({})", None), ("g::clamp({}, -0.5, 0.5)", None),
]
BINARY = ["({} + {})", "({} - {})", "({} * {})", "({} / (g::square({}) + 1.0))", "g::maximum({}, {})",
          "g::minimum({}, {})", "g::pow(g::sigmoid({}) + 0.5, {})"]


class Case:
    def __init__(self, rng, index):
        self.rng = rng
        self.index = index
        self.vars = []     # (name, shape)
        self.lets = []     # (name, code, shape)
        self.lines = []

    def var(self, shape):
        same = [n for n, s in self.vars if s == shape]
        if same and self.rng.random() < 0.4:
            return self.rng.choice(same)
        name = "v%d" % len(self.vars)
        self.vars.append((name, shape))
        return name

    def leaf(self, shape):
        return self.var(shape)

    def let(self, code, shape):
        name = "e%d" % len(self.lets)
        self.lets.append((name, code, shape))
        self.lines.append("const auto %s = %s;" % (name, code))
        return name

    def gen(self, shape, depth, top=False):
        r = self.rng
        shared = [n for n, _, s in self.lets if s == shape]
        if shared and not top and r.random() < 0.3:
            return r.choice(shared)
        if depth <= 0 or (not top and r.random() < 0.15):
            return self.leaf(shape)
        choices = ["unary", "unary", "binary", "binary", "where"]
        if len(shape) == 1:
            choices += ["reduce", "tie"]
        if len(shape) == 2:
            choices += ["matmul", "softmax", "transpose", "reduce_keep"]
        kind = r.choice(choices)
        if kind == "unary":
            code = r.choice(UNARY)[0].format(self.gen(shape, depth - 1))
        elif kind == "binary":
            a = self.gen(shape, depth - 1)
            bshape = shape
            if len(shape) == 2 and r.random() < 0.5:
                bshape = r.choice([(shape[1],), (shape[0], 1)])
            b = self.gen(bshape, depth - 1)
            if r.random() < 0.5 and bshape == shape:
                a, b = b, a
            code = r.choice(BINARY).format(a, b)
        elif kind == "where":
            code = "g::where(g::greater({}, {}), {}, {})".format(
                self.gen(shape, depth - 1), self.gen(shape, depth - 2), self.gen(shape, depth - 1),
                self.gen(shape, depth - 2))
        elif kind == "reduce":  # (n,) from (m, n) over axis 0 or (n, m) over axis 1
            m = r.choice(ROWS + [5])
            op = r.choice(["sum", "mean", "max", "min"])
            if r.random() < 0.5:
                code = "g::%s<0>(%s)" % (op, self.gen((m, shape[0]), depth - 1))
            else:
                code = "g::%s<1>(%s)" % (op, self.gen((shape[0], m), depth - 1))
        elif kind == "tie":  # every row of the operand equal: the maximum ties m ways
            m = r.choice(ROWS)
            op = r.choice(["max", "min"])
            code = "g::%s<0>(%s + %s * 0.0)" % (op, self.gen(shape, depth - 1), self.gen((m, shape[0]), depth - 2))
        elif kind == "reduce_keep" and shape[1] == 1:
            m = r.choice(COLS)
            op = r.choice(["sum", "mean", "max", "min"])
            code = "g::%s<1, true>(%s)" % (op, self.gen((shape[0], m), depth - 1))
        elif kind == "matmul":
            k = r.choice(INNER)
            a = self.gen((shape[0], k), depth - 1) if r.random() < 0.7 else "g::transpose(%s)" % self.gen((k, shape[0]), depth - 1)
            b = self.gen((k, shape[1]), depth - 1) if r.random() < 0.7 else "g::transpose(%s)" % self.gen((shape[1], k), depth - 1)
            code = "g::matmul(%s, %s)" % (a, b)
        elif kind == "softmax":
            code = "g::%s(%s)" % (r.choice(["softmax", "log_softmax"]), self.gen(shape, depth - 1))
        elif kind == "transpose":
            code = "g::transpose(%s)" % self.gen((shape[1], shape[0]), depth - 1)
        else:
            code = self.gen(shape, depth - 1)
        if depth >= 2 and code.startswith(("g::", "(", "-")) and r.random() < 0.35:
            return self.let(code, shape)
        return code

    def loss(self):
        r = self.rng
        if r.random() < 0.15:
            return self.image_loss()
        shape = r.choice([(r.choice(ROWS), r.choice(COLS)), (r.choice(COLS),)])
        e = self.gen(shape, r.choice([3, 4, 4, 5]), top=True)
        forms = ["g::sum({e})", "g::mean(g::square({e}))", "g::sum({e} * {w})", "g::max({e})", "g::min({e} * {w})"]
        if len(shape) == 2:
            forms += ["g::sum(g::max<1>({e}))", "g::sum(g::min<0>({e}) * {w1})", "g::mean(g::softmax_cross_entropy({e}, labels))"]
        form = r.choice(forms)
        w = self.leaf(shape) if "{w}" in form else ""
        w1 = self.leaf((shape[1],)) if "{w1}" in form else ""
        if "labels" in form:
            labels = ", ".join(str(r.randrange(shape[1])) for _ in range(shape[0]))
            self.lines.append("const auto labels = g::constant(xt::xtensor<std::int32_t, 1>{%s});" % labels)
        return form.format(e=e, w=w, w1=w1)

    def image_loss(self):
        r = self.rng
        n, c, o, k = 2, r.choice([1, 2]), r.choice([2, 3]), 3
        h, w = r.choice([5, 6, 7]), r.choice([5, 6, 8])
        stride, pad = r.choice([(1, 0), (1, 1), (2, 1)])
        x = self.var((n, c, h, w))
        wt = self.var((o, c, k, k))
        b = self.var((o,))
        y = "g::conv2d<%d, %d>(%s, %s) + g::reshape<1, %d, 1, 1>(%s)" % (stride, pad, x, wt, o, b)
        y = r.choice(["g::relu({})", "g::tanh({})", "({})"]).format(y)
        oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        if oh >= 2 and ow >= 2:
            y = r.choice(["g::max_pool2d<2>({})", "g::avg_pool2d<2>({})", "{}"]).format(y)
        return r.choice(["g::sum(g::square({}))", "g::mean(g::tanh({}))", "g::sum(g::max<1>(g::flatten({})))"]).format(y)


def case_source(seed, index):
    c = Case(random.Random(seed * 7919 + index), index)
    loss = c.loss()
    decls = ["g::variable<\"%s\", T, %s> %s;" % (n, ", ".join(map(str, s)), n) for n, s in c.vars]
    text = "; ".join(["%s %s" % (n, "x".join(map(str, s))) for n, s in c.vars] +
                     ["%s = %s" % (n, code) for n, code, _ in c.lets] + ["loss = " + loss])
    body = "\n".join("  " + l for l in decls + c.lines)
    vars_ = ", ".join(n for n, _ in c.vars)
    return """
BOOST_AUTO_TEST_CASE(case_{i}) {{
  gradus_test::differential_check({seed}ull, {i}, "{text}", []<class T>(T) {{
{body}
    const auto loss = {loss};
    return std::tuple{{loss, std::tuple{{{vars}}}}};
  }});
}}
""".format(i=index, seed=seed, text=text.replace("\\", "\\\\").replace('"', '\\"'), body="  " + body.replace("\n", "\n  "),
           loss=loss, vars=vars_)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--cases", type=int, default=6)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    src = ["// Generated by tests/differential/gen_cases.py --seed %d --cases %d: do not edit." % (a.seed, a.cases),
           "#define BOOST_TEST_MODULE differential_seed_%d" % a.seed,
           '#include "check_case.hpp"', "", "namespace g = gradus;"]
    src += [case_source(a.seed, i) for i in range(a.cases)]
    with open(a.out, "w") as f:
        f.write("\n".join(src))


if __name__ == "__main__":
    main()
