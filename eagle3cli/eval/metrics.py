"""Acceptance statistics from per-round accept lengths, and the measured cost model behind the
recommended serving configuration. Pure functions on numbers."""

from __future__ import annotations


def acceptance_by_depth(accept_lens: list[int], depth: int) -> dict:
    """Conditional alpha_k = P(depth k accepted | depths < k accepted), unconditional
    P(first k accepted), with the counts, and tau(d) = 1 + sum_{k<=d} P(first k accepted) for
    every d <= depth (tokens per target forward, the bonus token included).

    With greedy chain drafting the accept length at depth d is min(a, d) for the same drafts,
    so one depth-D run gives tau(d) for all shorter chains.
    """
    rounds = len(accept_lens)
    rows = []
    tau = 1.0
    taus = [1.0]
    for k in range(1, depth + 1):
        attempts = sum(1 for a in accept_lens if a >= k - 1)
        accepted = sum(1 for a in accept_lens if a >= k)
        uncond = accepted / rounds if rounds else 0.0
        tau += uncond
        taus.append(tau)
        rows.append(
            {
                "depth": k,
                "attempts": attempts,
                "accepted": accepted,
                "alpha": accepted / attempts if attempts else None,
                "unconditional": uncond,
                "tau_at_depth": tau,
            }
        )
    return {
        "rounds": rounds,
        "tau": (sum(accept_lens) + rounds) / rounds if rounds else 1.0,
        "tau_by_depth": taus,  # index d: tau with a chain of depth d (d=0: plain decoding)
        "per_depth": rows,
        "accept_len_histogram": [sum(1 for a in accept_lens if a == n) for n in range(depth + 1)],
    }


def fit_linear(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    return my - slope * mx, slope


def predicted_speedup(
    tau: float, target_cost: dict[int, float], n_verify: int, draft_calls: int, draft_step: float, target_1: float
) -> float:
    """tokens per second of speculation over plain decoding, from measured costs (seconds)."""
    t_verify = interpolate(target_cost, n_verify)
    round_time = t_verify + draft_calls * draft_step
    return (tau / round_time) * target_1


def interpolate(cost: dict[int, float], n: int) -> float:
    keys = sorted(cost)
    if n <= keys[0]:
        return cost[keys[0]]
    for lo, hi in zip(keys, keys[1:]):
        if lo <= n <= hi:
            w = (n - lo) / (hi - lo)
            return cost[lo] * (1 - w) + cost[hi] * w
    lo, hi = keys[-2], keys[-1]
    return cost[hi] + (cost[hi] - cost[lo]) / (hi - lo) * (n - hi)


def recommend(chain_taus: list[float], cost: dict, tree: dict | None = None) -> dict:
    """Steps / topk / draft tokens (SGLang's --speculative-num-steps / -eagle-topk /
    -num-draft-tokens) with the best predicted speedup.

    Chains of every depth d use tau(d) from the chain run: a round is one target pass over d+1
    tokens plus d draft calls. A measured tree configuration competes with its own tau.
    num_draft_tokens counts the tokens verified per pass, the root included (as SGLang does), so
    a chain of d steps has d + 1, as SGLang requires when topk = 1.
    """
    t1 = cost["target"][1]
    options = []
    for d in range(1, len(chain_taus)):
        s = predicted_speedup(chain_taus[d], cost["target"], d + 1, d, cost["draft_step"], t1)
        options.append(
            {
                "steps": d,
                "topk": 1,
                "num_draft_tokens": d + 1,
                "predicted_speedup": round(s, 3),
                "from": f"chain tau({d}) = {chain_taus[d]:.3f}",
            }
        )
    if tree:
        s = predicted_speedup(
            tree["tau"], cost["target"], tree["num_draft_tokens"], tree["steps"], cost["draft_step"], t1
        )
        options.append(
            {
                "steps": tree["steps"],
                "topk": tree["topk"],
                "num_draft_tokens": tree["num_draft_tokens"],
                "predicted_speedup": round(s, 3),
                "from": f"tree tau = {tree['tau']:.3f}",
            }
        )
    if not options:
        return {"steps": 1, "topk": 1, "num_draft_tokens": 2, "predicted_speedup": None, "from": "no measurement"}
    best = max(options, key=lambda o: o["predicted_speedup"])
    if best["predicted_speedup"] < 1.0:
        best["note"] = "no configuration is predicted to beat plain decoding with this head"
    return best
