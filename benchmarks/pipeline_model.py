#!/usr/bin/env python3
"""A discrete-event model of one rank per core running a 2-stage pipeline of mnist_deep_mlp's
layers (issue 31): 1F1B against Megatron-LM's interleaved 1F1B (each rank holding v chunks),
with gradients for the weights deferred to the rank's idle time, as gradus's pipeline does
(include/gradus/parallel/pipeline/deferred_gradients.hpp), and one synchronous update per
batch. It answers "is the bubble or the work what a step loses?" before building a schedule.

  benchmarks/pipeline_model.py [--one-step US] [--speed1 F ...] [--tx US] [--micro M]

Costs are microseconds per million weights of a layer, per 8-row micro-batch pass (forward,
input gradient) or per batch (weight gradient, momentum update), from stop 57's op-by-op
timelines on the Emerald Rapids host (benchmarks/results/issue31_probe_ahead.md); the first
layer has no input gradient. --speed1 scales rank 1's costs (its vCPU slower or faster than
rank 0's). Prints each schedule's step time, its ratio over --one-step (the one-process
step), and the busier rank's work: the step cannot be shorter than that.
"""
import argparse

LAYERS = [("in", 0.401)] + [(f"h{i}", 0.262) for i in range(1, 8)] + [("out", 0.005)]


def chunk_cost(layers, first, a, k):
    w = sum(p for _, p in layers) * k
    wb = sum(p for n, p in layers if not (first and n == "in")) * k
    return dict(F=a.fw * w + a.over, B=a.bw * wb + a.over, W=a.wg * w, U=a.up * w)


def order(rank, S, v, M):
    """Rank's passes: (kind, local chunk, micro-batch); v = 1 is PipeDream-flush's 1F1B."""
    n = v * M
    fchunk = lambda k: (k // S) % v
    micro = lambda k: (k // (S * v)) * S + k % S if v > 1 else k
    warm = min((S - rank - 1) * 2 + (v - 1) * S if v > 1 else S - rank - 1, n)
    F = [("F", fchunk(k), micro(k)) for k in range(n)]
    B = [("B", v - 1 - fchunk(k), micro(k)) for k in range(n)]
    ops, f, b = F[:warm], warm, 0
    while f < n:
        ops += [F[f], B[b]]
        f, b = f + 1, b + 1
    return ops + B[b:]


def simulate(S, v, M, cuts, a, speed, steps=6):
    C = S * v
    cc = [chunk_cost(cuts[g], g == 0, a, speed[g % S]) for g in range(C)]
    orders = [order(r, S, v, M) for r in range(S)]
    done, ready, t_rank, starts = {}, [0.0] * C, [0.0] * S, []
    for st in range(steps):
        starts.append(min(t_rank))
        pend, idx = [0.0] * C, [0] * S
        for _ in range(sum(map(len, orders))):
            best = None
            for r in range(S):
                if idx[r] == len(orders[r]):
                    continue
                kind, lc, m = orders[r][idx[r]]
                g = lc * S + r
                if kind == "F":
                    key, after = ((st, "F", g - 1, m), a.tx) if g else (None, 0.0)
                else:
                    key, after = ((st, "F", g, m), 0.0) if g == C - 1 else ((st, "B", g + 1, m), a.tx)
                if key is not None and key not in done:
                    continue  # its input has not been computed yet
                dep = max(done[key] + after if key else 0.0, ready[g] if kind == "F" else 0.0)
                start = max(t_rank[r], dep)
                if best is None or start < best[0]:
                    best = (start, r, kind, g, m)
            assert best is not None, "the schedule deadlocks"
            start, r, kind, g, m = best
            gap = start - t_rank[r]  # idle: the deferred weight gradients fill it
            for h in range(r, C, S):
                use = min(gap, pend[h])
                pend[h], gap = pend[h] - use, gap - use
            t_rank[r] = done[(st, kind, g, m)] = start + cc[g][kind]
            if kind == "B":
                pend[g] += cc[g]["W"] / M
            idx[r] += 1
        for r in range(S):  # the update: the rest of the weight gradients, then momentum
            for h in range(r, C, S):
                t_rank[r] += pend[h] + cc[h]["U"]
                ready[h] = t_rank[r]
    per = [starts[i + 1] - starts[i] for i in range(1, steps - 1)]
    work = [sum(M * (cc[g]["F"] + cc[g]["B"]) + cc[g]["W"] + cc[g]["U"] for g in range(r, C, S)) for r in range(S)]
    return sum(per) / len(per), max(work)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--one-step", type=float, default=9700.0, help="the one-process step, us (64 rows)")
    p.add_argument("--speed1", type=float, nargs="*", default=[0.9, 1.0, 1.1, 1.2], help="rank 1's cost factors")
    p.add_argument("--tx", type=float, default=15.0, help="a transfer's latency, us")
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--fw", type=float, default=210.0, help="forward, us per M weights per 8-row pass")
    p.add_argument("--bw", type=float, default=160.0, help="input gradient, us per M weights per pass")
    p.add_argument("--wg", type=float, default=1200.0, help="weight gradient, us per M weights per batch")
    p.add_argument("--up", type=float, default=700.0, help="momentum update, us per M weights per batch")
    p.add_argument("--over", type=float, default=8.0, help="a pass's fixed cost, us")
    a = p.parse_args()
    cut2 = [LAYERS[:4], LAYERS[4:]]
    cut4 = [LAYERS[:2], LAYERS[2:4], LAYERS[4:6], LAYERS[6:]]
    print("| rank 1's cost factor | 1F1B step (us) | vs one process | busier rank's work | interleaved, v = 2 | vs one process |")
    print("|---|---|---|---|---|---|")
    for f in a.speed1:
        s1, w1 = simulate(2, 1, a.micro, cut2, a, (1.0, f))
        s2, _ = simulate(2, 2, a.micro, cut4, a, (1.0, f))
        print(f"| {f:.2f} | {s1:.0f} | {a.one_step / s1:.2f}x | {w1:.0f} | {s2:.0f} | {a.one_step / s2:.2f}x |")


if __name__ == "__main__":
    main()
