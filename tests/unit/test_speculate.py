"""Pure speculation maths: sampling, chain/tree verification (greedy and lossless sampling),
tree selection, tree attention masks and position ids."""

from __future__ import annotations

import torch
from chi_square import chi_square_pvalue

from eagle3cli.speculate import (
    expand_frontier,
    logits_to_probs,
    node_depths,
    residual,
    select_nodes,
    tree_attention_mask,
    tree_position_ids,
    verify_chain_greedy,
    verify_chain_sampling,
    verify_tree_greedy,
    verify_tree_sampling,
)


def test_probs_greedy_and_top_p():
    logits = torch.tensor([1.0, 3.0, 2.0, -1.0])
    assert logits_to_probs(logits, 0.0).tolist() == [0, 1, 0, 0]
    p = logits_to_probs(logits, 1.0, top_p=0.8)
    full = torch.softmax(logits, -1)
    assert p[3] == 0 and p[0] == 0  # 0.665 + 0.245 covers 0.8; the rest is cut
    assert torch.allclose(p[1] / p[2], full[1] / full[2])
    assert abs(float(p.sum()) - 1) < 1e-6


def test_residual():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(residual(p, p), p)  # no mass left: fall back to p


def test_chain_greedy():
    logits = torch.full((4, 10), -5.0)
    for row, tok in enumerate([3, 4, 9, 1]):
        logits[row, tok] = 5
    a, out = verify_chain_greedy(torch.tensor([3, 4, 7]), logits)
    assert a == 2 and out.tolist() == [3, 4, 9]
    a, out = verify_chain_greedy(torch.tensor([3, 4, 9]), logits)
    assert a == 3 and out.tolist() == [3, 4, 9, 1]
    a, out = verify_chain_greedy(torch.tensor([0, 4, 9]), logits)
    assert a == 0 and out.tolist() == [3]


def test_chain_sampling_first_token_follows_target():
    """Speculative sampling: the first emitted token is distributed as the target's row 0,
    whatever the draft distribution; and given d_1 accepted, the second as row 1."""
    g = torch.Generator().manual_seed(0)
    v, d, n = 6, 2, 8000
    p = torch.softmax(torch.randn(d + 1, v, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(d, v, generator=g) * 1.5, -1)
    first = torch.zeros(v)
    second = torch.zeros(v)
    for _ in range(n):
        drafts = torch.stack([torch.multinomial(q[j], 1, generator=g)[0] for j in range(d)])
        a, out = verify_chain_sampling(drafts, q, p, g)
        assert len(out) == a + 1
        first[out[0]] += 1
        if a >= 1 and drafts[0] == 2:  # row 1 is "the target after d_1" whatever d_1 was
            second[out[1]] += 1
    assert chi_square_pvalue(first, p[0]) > 1e-3
    assert chi_square_pvalue(second, p[1]) > 1e-3


def test_chain_sampling_detects_a_biased_rule():
    """The test above has power: accepting drafts always is visibly not the target distribution."""
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([0.7, 0.1, 0.1, 0.1])
    q = torch.tensor([0.1, 0.1, 0.1, 0.7])
    counts = torch.zeros(4)
    for _ in range(5000):
        counts[torch.multinomial(q, 1, generator=g)[0]] += 1  # "always accept"
    assert chi_square_pvalue(counts, p) < 1e-6


def _example_tree():
    #        root
    #      /   |   \
    #     0(5) 1(7) 2(2)
    #    /  \     \
    #  3(1) 4(3)   5(4)
    #   |
    #  6(8)
    tokens = torch.tensor([5, 7, 2, 1, 3, 4, 8])
    parents = torch.tensor([-1, -1, -1, 0, 0, 1, 3])
    return tokens, parents


def _path(parents, i):
    out = []
    while i != -1:
        out.append(i)
        i = int(parents[i])
    return out[::-1]


def test_tree_mask_and_positions_match_per_path_reference():
    tokens, parents = _example_tree()
    mask = tree_attention_mask(parents)
    depths = node_depths(parents)
    pos = tree_position_ids(depths, root_position=100)
    assert mask[0].tolist() == [True] + [False] * 7
    assert pos[0] == 100
    for i in range(len(tokens)):
        path = _path(parents, i)
        ref = torch.zeros(len(tokens) + 1, dtype=torch.bool)
        ref[0] = True
        ref[[j + 1 for j in path]] = True
        assert mask[i + 1].tolist() == ref.tolist(), f"node {i}"
        assert int(pos[i + 1]) == 100 + len(path)
        assert int(depths[i]) == len(path)


def test_tree_greedy_follows_target_argmax():
    tokens, parents = _example_tree()
    v = 10
    logits = torch.zeros(8, v)
    # root wants 5 (node 0), node 0 wants 1 (node 3), node 3 wants 8 (node 6), node 6 wants 9 (bonus)
    for row, tok in [(0, 5), (1, 1), (4, 8), (7, 9), (2, 0), (3, 0), (5, 0), (6, 0)]:
        logits[row, tok] = 10
    path, out = verify_tree_greedy(tokens, parents, logits)
    assert path == [0, 3, 6] and out.tolist() == [5, 1, 8, 9]
    logits[0] = 0
    logits[0, 7] = 10  # root wants 7 (node 1); node 1 wants 0: no such child
    path, out = verify_tree_greedy(tokens, parents, logits)
    assert path == [1] and out.tolist() == [7, 0]
    logits[0] = 0
    logits[0, 6] = 10  # no child matches
    path, out = verify_tree_greedy(tokens, parents, logits)
    assert path == [] and out.tolist() == [6]


def test_tree_sampling_is_lossless():
    """Multi-candidate rejection over siblings: the first emitted token follows the root's target
    row, and given node 0 was accepted the next follows node 0's row, for any candidate set."""
    g = torch.Generator().manual_seed(2)
    tokens, parents = _example_tree()
    v = 10
    p = torch.softmax(torch.randn(8, v, generator=g) * 1.2, -1)
    first, after0 = torch.zeros(v), torch.zeros(v)
    for _ in range(8000):
        path, out = verify_tree_sampling(tokens, parents, p, g)
        first[out[0]] += 1
        if path[:1] == [0]:
            after0[out[1]] += 1
    assert chi_square_pvalue(first, p[0]) > 1e-3
    assert chi_square_pvalue(after0, p[1]) > 1e-3
    assert after0.sum() > 400


def test_expand_and_select_keep_the_best_ancestor_closed_nodes():
    lp = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.5, 0.4, 0.3, 0.2]]), -1)
    scores, toks, slot = expand_frontier(torch.tensor([-0.1, -2.0]), lp, 2)
    assert toks.tolist() == [0, 1, 0, 1] and slot.tolist() == [0, 0, 1, 1]
    assert torch.allclose(scores[:2], -0.1 + lp[0, :2])
    # candidates: 2 roots' children then their children (parents index the candidate list)
    cand_tokens = torch.tensor([10, 11, 20, 21, 22, 23])
    cand_parents = torch.tensor([-1, -1, 0, 0, 1, 1])
    cand_scores = torch.tensor([-0.1, -2.0, -0.3, -1.5, -2.1, -2.2])
    tree = select_nodes(cand_tokens, cand_parents, cand_scores, 4)
    assert tree.tokens.tolist() == [10, 11, 20, 21]
    assert tree.parents.tolist() == [-1, -1, 0, 0]
    assert tree.depths.tolist() == [1, 1, 2, 2]
    # a tie between a child and its parent never strands the child without its parent
    tree = select_nodes(torch.tensor([1, 2]), torch.tensor([-1, 0]), torch.tensor([-1.0, -1.0]), 1)
    assert tree.tokens.tolist() == [1] and tree.parents.tolist() == [-1]


def _select_reference(parents: list[int], scores: list[float], n: int) -> list[int]:
    """EAGLE-2's rerank by definition: repeatedly take the best candidate whose parent is taken
    (ties to the earlier candidate); returned in creation order."""
    taken: list[int] = []
    while len(taken) < n:
        ok = [i for i in range(len(parents)) if i not in taken and (parents[i] == -1 or parents[i] in taken)]
        if not ok:
            break
        taken.append(min(ok, key=lambda i: (-scores[i], i)))
    return sorted(taken)


def test_select_nodes_equals_the_greedy_definition_on_random_trees():
    g = torch.Generator().manual_seed(5)
    for trial in range(200):
        n = int(torch.randint(1, 40, (1,), generator=g))
        parents, scores = [], []
        for i in range(n):
            p = -1 if i == 0 or torch.rand(1, generator=g) < 0.2 else int(torch.randint(0, i, (1,), generator=g))
            lp = 0.0 if torch.rand(1, generator=g) < 0.2 else -float(torch.rand(1, generator=g)) * 3  # ties too
            parents.append(p)
            scores.append((scores[p] if p >= 0 else 0.0) + round(lp, 1))
        k = int(torch.randint(1, n + 1, (1,), generator=g))
        sc = torch.tensor(scores)  # float32, as the decoder's scores
        tree = select_nodes(torch.arange(n) + 100, torch.tensor(parents), sc, k)
        want = _select_reference(parents, sc.tolist(), k)
        assert (tree.tokens - 100).tolist() == want, trial
        for j, p in enumerate(tree.parents.tolist()):  # parents re-indexed into the kept list
            assert p == -1 or want[p] == parents[want[j]]
        assert tree.depths.tolist() == [len(_path(tree.parents, j)) for j in range(len(want))]
