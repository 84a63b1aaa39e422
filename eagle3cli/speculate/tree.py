"""EAGLE-2 dynamic draft trees: build (top-k frontier by cumulative log-prob), select the best
N nodes, attention mask and position ids for one verification pass, greedy and lossless
sampling verification.

Nodes are numbered 0..N-1 in an order where every parent precedes its children; `parents[i]`
is the parent's node index, or -1 for a child of the root. The verification input is
`[root, node_0, ..., node_{N-1}]` where root is the last committed token (not yet in the
target's KV cache); row 0 of target logits/probs belongs to the root, row i+1 to node i.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import residual, sample_from


@dataclass(frozen=True)
class DraftTree:
    tokens: torch.Tensor  # [N] token ids (whatever vocab the caller uses)
    parents: torch.Tensor  # [N] parent node index, -1 = the root
    depths: torch.Tensor  # [N] 1 for the root's children
    scores: torch.Tensor  # [N] cumulative draft log-probability of the path to the node

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def expand_frontier(frontier_scores: torch.Tensor, child_logprobs: torch.Tensor, topk: int):
    """Each frontier node's top-k children, scored by cumulative log-prob.

    frontier_scores [k], child_logprobs [k, V] -> (scores [k*topk], tokens [k*topk],
    parent_slot [k*topk]) where parent_slot indexes the frontier.
    """
    lp, tok = child_logprobs.topk(topk, dim=-1)
    scores = (frontier_scores[:, None] + lp).reshape(-1)
    slot = torch.arange(child_logprobs.shape[0], device=child_logprobs.device).repeat_interleave(topk)
    return scores, tok.reshape(-1), slot


def select_nodes(tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, num_nodes: int) -> DraftTree:
    """The best `num_nodes` candidates by cumulative score, closed under ancestors (EAGLE-2 rerank).

    Candidates come in creation order (parents before children, `parents` indexing the candidate
    list). A child never outscores its parent (it adds a log-prob <= 0), and a stable sort puts
    a parent before a child it ties with, so the best-N prefix of the stable order is already
    ancestor-closed.
    """
    order = torch.sort(-scores, stable=True).indices[:num_nodes]
    keep = order.sort().values  # creation order keeps parents first
    new_index = torch.full_like(parents, -1)
    new_index[keep] = torch.arange(keep.shape[0], device=keep.device)
    par = parents[keep]
    new_parents = torch.where(par >= 0, new_index[par.clamp_min(0)], par)
    return DraftTree(tokens[keep], new_parents, node_depths(new_parents), scores[keep])


def node_depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of each node (1 for the root's children); parents precede children."""
    depths = torch.ones_like(parents)
    for _ in range(parents.shape[0]):  # one pass per level; stops once nothing changes
        nxt = torch.where(parents >= 0, depths[parents.clamp_min(0)] + 1, 1)
        if torch.equal(nxt, depths):
            break
        depths = nxt
    return depths


def tree_attention_mask(parents: torch.Tensor) -> torch.Tensor:
    """Bool [N+1, N+1] over `[root, nodes...]`: each entry sees the root, its ancestors and itself."""
    n = int(parents.shape[0])
    up = torch.cat([parents.new_zeros(1), parents + 1])  # the row of each entry's parent (root: itself)
    eye = torch.eye(n + 1, dtype=torch.bool, device=parents.device)
    mask = eye.clone()
    mask[:, 0] = True
    for _ in range(n):  # one pass per level
        nxt = eye | mask[up]
        nxt[:, 0] = True
        if torch.equal(nxt, mask):
            break
        mask = nxt
    return mask


def tree_position_ids(depths: torch.Tensor, root_position: int) -> torch.Tensor:
    """LongTensor [N+1]: the root at `root_position` (= tokens already in the KV cache), a node at
    root_position + depth, as if its path were the sequence."""
    return torch.cat([depths.new_zeros(1), depths]) + root_position


def children_of(parents: torch.Tensor) -> dict[int, list[int]]:
    """node -> its children in node order (-1: the root's)."""
    out: dict[int, list[int]] = {}
    for i, p in enumerate(parents.tolist()):
        out.setdefault(p, []).append(i)
    return out


def verify_tree_greedy(
    tokens: torch.Tensor, parents: torch.Tensor, target_logits: torch.Tensor
) -> tuple[list[int], torch.Tensor]:
    """(accepted node indices root->leaf, emitted tokens [len + 1]): descend while a child equals
    the target's argmax at its parent; the last argmax is the bonus token."""
    argmax = target_logits.argmax(-1).tolist()
    kids = children_of(parents)
    toks = tokens.tolist()
    path: list[int] = []
    node, row = -1, 0
    while True:
        want = argmax[row]
        nxt = next((c for c in kids.get(node, []) if toks[c] == want), None)
        if nxt is None:
            break
        path.append(nxt)
        node, row = nxt, nxt + 1
    emitted = [toks[i] for i in path] + [argmax[row]]
    return path, torch.tensor(emitted, dtype=torch.long)


def verify_tree_sampling(
    tokens: torch.Tensor, parents: torch.Tensor, target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[list[int], torch.Tensor]:
    """Lossless multi-candidate rejection sampling over a tree whose candidates were chosen
    deterministically (top-k), so each candidate is a point-mass proposal q = onehot(x).

    At a node with target distribution p, try its children in order: accept child x with
    probability p(x) (= min(1, p/q)); on rejection p <- normalize(max(0, p - onehot(x))), i.e. x
    removed. On acceptance descend into x; if every child is rejected (or there are none),
    draw the final token from the current p. Each try is one speculative-sampling step, so the
    emitted tokens follow the target's distribution exactly (as SGLang's target-only tree
    sampling does).
    """
    kids = children_of(parents)
    toks = tokens.tolist()
    path: list[int] = []
    node, row = -1, 0
    while True:
        p = target_probs[row].clone()
        accepted = None
        for c in kids.get(node, []):
            x = toks[c]
            u = float(torch.rand(1, generator=generator, device=p.device))
            if u < float(p[x]):
                accepted = c
                break
            q = torch.zeros_like(p)
            q[x] = 1.0
            p = residual(p, q)
        if accepted is None:
            last = int(sample_from(p, generator))
            break
        path.append(accepted)
        node, row = accepted, accepted + 1
    emitted = [toks[i] for i in path] + [last]
    return path, torch.tensor(emitted, dtype=torch.long)
