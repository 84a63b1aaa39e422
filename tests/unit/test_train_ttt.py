"""The fast masked TTT loss equals an explicit step-by-step reference unroll (values and grads)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny_configs import tiny_llama_config

from eagle3cli.speculate.acceptance import conditional_acceptance, simulated_accept_length
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target
from eagle3cli.speculate.ttt import (
    compiled_ttt_loss,
    draft_ttt_loss,
    soft_cross_entropy,
    teacher_from_hidden,
    teacher_from_topk,
)
from eagle3cli.speculate.vocab import target_to_draft_index

V, H, VD, T, B, K = 96, 32, 40, 11, 2, 4


def tiny_draft(seed: int = 0, norm_before_fc: bool = False, norm_before_residual: bool = False) -> Eagle3Draft:
    tcfg = tiny_llama_config(V, layers=4, hidden=H)
    torch.manual_seed(seed)
    draft = Eagle3Draft(draft_config_from_target(tcfg, VD, (2, 2, 1), norm_before_fc, norm_before_residual)).double()
    for p in draft.parameters():  # non-trivial norms, so a wrong norm placement shows
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5)
    d2t = torch.sort(torch.randperm(V)[:VD]).values - torch.arange(VD)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.arange(VD) + d2t] = True
    draft.set_vocab_maps(d2t, t2d)
    return draft


def tiny_batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    aux = torch.randn(B, T, 3 * H, generator=g, dtype=torch.float64)
    loss_mask = torch.rand(B, T, generator=g) > 0.3
    lengths = torch.tensor([T, T - 3])
    for b, n in enumerate(lengths):  # right padding on the second row
        ids[b, n:] = 0
        loss_mask[b, n:] = False
    last_hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    lm_head = torch.randn(V, H, generator=g, dtype=torch.float64)
    return {"input_ids": ids, "aux_hidden": aux, "loss_mask": loss_mask}, last_hidden, lm_head


def reference_loss(draft: Eagle3Draft, batch, teacher, steps: int, w: float):
    """Per anchor t: step 0 over the prefix [0, t] into a fresh draft cache, then chain steps
    1..K-1 on the draft's own hidden state, one incremental `forward` each (the decoder's draft
    step, at slot = position t + j). Loss written out per anchor."""
    ids, aux, lm = batch["input_ids"], batch["aux_hidden"], batch["loss_mask"]
    total = 0.0
    for k_step in range(steps):
        num, den = 0.0, 0
        for b in range(ids.shape[0]):
            ids_b = ids[b : b + 1]
            tokens0 = F.pad(ids_b[:, 1:], (0, 1))
            for t in range(T):
                tp, pp = t + 2 + k_step, t + 1 + k_step
                if tp >= T or not lm[b, tp] or not teacher.valid[b, pp]:
                    continue
                cache = draft.new_cache(T + steps)
                h = draft(tokens0[:, : t + 1], aux[b : b + 1, : t + 1], cache, 0, from_target=True)[:, t : t + 1]
                for j in range(1, k_step + 1):
                    h = draft(ids_b[:, t + 1 + j : t + 2 + j], h, cache, t + j, from_target=False)
                logp = torch.log_softmax(draft.logits(h)[0, 0], -1)
                num = num - (teacher.at(b, pp) * logp).sum()
                den += 1
        total = total + (w**k_step) * num / max(den, 1)
    return total


@pytest.mark.parametrize("norms", [(False, False), (True, True)], ids=["eagle3", "eagle3.1-norms"])
def test_fast_ttt_equals_reference_unroll_values_and_grads(norms):
    """Also with EAGLE-3.1's input_norm and norm_before_residual: every step of the unroll equals
    the decoding step chained, values and gradients (input_norm's included)."""
    draft = tiny_draft(0, *norms)
    ref = copy.deepcopy(draft)
    batch, last_hidden, lm_head = tiny_batch()
    teacher = teacher_from_hidden(last_hidden, lm_head, draft.d2t)
    assert teacher.valid.any() and not teacher.valid.all()  # both branches of the mask are exercised

    fast = draft_ttt_loss(draft, batch, teacher, K, step_weight=0.8)
    slow = reference_loss(ref, batch, teacher, K, 0.8)
    fast.loss.backward()
    slow.backward()
    assert fast.count.min() > 0
    torch.testing.assert_close(fast.loss, slow, rtol=1e-6, atol=1e-8)  # ttt_unroll takes softmax in fp32
    for (name, p), (_, q) in zip(draft.named_parameters(), ref.named_parameters(), strict=True):
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_loss_ignores_padding_and_masked_positions():
    draft = tiny_draft()
    batch, last_hidden, lm_head = tiny_batch()
    teacher = teacher_from_hidden(last_hidden, lm_head, draft.d2t)
    base = draft_ttt_loss(draft, batch, teacher, K).loss.item()
    # changing padded tokens/features (row 1 beyond its length) must not change the loss
    batch2 = {k: v.clone() for k, v in batch.items()}
    batch2["input_ids"][1, T - 3 :] = 5
    batch2["aux_hidden"][1, T - 3 :] += 10.0
    assert abs(draft_ttt_loss(draft, batch2, teacher, K).loss.item() - base) < 1e-12
    # with no assistant positions nothing is counted and the loss is zero
    batch2["loss_mask"][:] = False
    out = draft_ttt_loss(draft, batch2, teacher, K)
    assert out.loss.item() == 0.0 and out.count.sum() == 0


def test_teacher_restricted_to_draft_vocab_and_topk_agrees():
    draft = tiny_draft()
    _, last_hidden, lm_head = tiny_batch()
    th = teacher_from_hidden(last_hidden, lm_head, draft.d2t)
    torch.testing.assert_close(th.probs.sum(-1), torch.ones(int(th.valid.sum()), dtype=torch.float32))
    chunked = teacher_from_hidden(last_hidden, lm_head, draft.d2t, rows=5)  # row chunking changes nothing
    assert torch.equal(chunked.probs, th.probs) and torch.equal(chunked.valid, th.valid)
    full = torch.log_softmax((last_hidden @ lm_head.t()).float(), -1)
    # the argmax is valid exactly when the target's top token is a draft token, and then maps back
    top = full.argmax(-1)
    assert torch.equal(th.valid, draft.t2d[top])
    assert torch.equal(draft.draft_to_target(th.argmax)[th.valid], top[th.valid])
    # the compact cache with k = whole vocab gives the same teacher
    lp, ids = full.topk(V, dim=-1)
    tk = teacher_from_topk(ids, lp, draft.d2t, V)
    torch.testing.assert_close(tk.probs, th.probs, rtol=1e-5, atol=1e-6)
    assert torch.equal(tk.valid, th.valid) and torch.equal(tk.argmax[tk.valid], th.argmax[th.valid])
    # and with a small k the teacher puts mass only on draft ids within the top-k
    lp4, ids4 = full.topk(4, dim=-1)
    t4 = teacher_from_topk(ids4, lp4, draft.d2t, V)
    idx = target_to_draft_index(draft.d2t, V)
    for b, t in t4.valid.nonzero().tolist():
        allowed = {int(i) for i in idx[ids4[b, t]] if i >= 0}
        assert set(torch.nonzero(t4.at(b, t)).flatten().tolist()) <= allowed


def test_stored_argmax_and_needed_rows_change_nothing():
    """The cache's stored target argmax and computing only the rows the loss reads give the same
    loss and gradients as the full-vocab teacher on every position."""
    draft = tiny_draft()
    batch, last_hidden, lm_head = tiny_batch()
    full = teacher_from_hidden(last_hidden, lm_head, draft.d2t)
    lean = teacher_from_hidden(
        last_hidden,
        lm_head,
        draft.d2t,
        loss_mask=batch["loss_mask"],
        target_argmax=(last_hidden @ lm_head.t()).argmax(-1),
    )
    assert lean.probs.shape[0] < full.probs.shape[0]  # prompt rows are not computed
    assert torch.equal(lean.valid, full.valid) and torch.equal(lean.argmax, full.argmax)
    a, b = draft_ttt_loss(draft, batch, full, K), draft_ttt_loss(copy.deepcopy(draft), batch, lean, K)
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-12, atol=0)
    assert torch.equal(a.correct, b.correct) and torch.equal(a.count, b.count)


def test_soft_cross_entropy_matches_log_softmax_on_bf16_logits():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(7, 50, generator=g).to(torch.bfloat16).requires_grad_()
    p = torch.softmax(torch.randn(7, 50, generator=g), -1)
    ce, arg = soft_cross_entropy(z, p)
    ce.backward()
    z32 = z.detach().float().requires_grad_()
    ref = -(p * torch.log_softmax(z32, -1)).sum()
    ref.backward()
    torch.testing.assert_close(ce, ref, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(z.grad.float(), z32.grad, rtol=1e-2, atol=1e-3)  # bf16 grads
    assert z.grad.dtype == torch.bfloat16 and torch.equal(arg, z32.argmax(-1))


def test_acceptance_summaries():
    assert simulated_accept_length([1.0] * 7) == 7.0
    assert simulated_accept_length([0.5, 0.5]) == pytest.approx(0.75)
    assert simulated_accept_length([0.0, 1.0]) == 0.0
    assert conditional_acceptance([8, 4, 4], [10, 10, 10]) == pytest.approx([0.8, 0.5, 1.0])


@pytest.mark.slow
def test_compiled_loss_equals_eager_across_shapes_in_one_compilation():
    """`eagle3 train --compile`: the unroll traced by torch.compile with dynamic shapes (dynamo + AOT
    autograd, the parts our code decides) gives the eager loss and gradients on batches of
    different sizes, compiled once (a length-specialised trace recompiles per batch, minutes each
    with inductor). The aot_eager backend skips inductor's C++ code generation, which takes
    minutes on this CPU and is torch's own business; `make bench` trains with the full compile."""
    from torch._dynamo.backends.registry import lookup_backend

    traced = []

    def counting(gm, example_inputs):
        traced.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    compiled = compiled_ttt_loss(backend=counting)
    first = 0
    draft = tiny_draft().float()  # one module, as in training (a new module is another compiled case)
    twin = copy.deepcopy(draft)
    params = [(n, p) for n, p in draft.named_parameters() if p.requires_grad]
    twin_params = [p for _, p in twin.named_parameters() if p.requires_grad]
    # after the first change of shape dynamo 2.13 may trace once more (a guard of its own fails with
    # "'NoneType' object has no attribute 'size'"); from then on no new length or batch size may
    # trace again (an index built from the length used to recompile every batch)
    shapes = ((1, False, T), (2, False, T - 4), (3, False, T - 2), (4, True, T - 1))
    for i, (seed, twice, cut) in enumerate(shapes):
        batch, last_hidden, lm_head = tiny_batch(seed)
        if twice:  # 2B rows: the batch size varies too
            other, other_hidden, _ = tiny_batch(seed + 10)
            batch = {k: torch.cat([v, other[k]]) for k, v in batch.items()}
            last_hidden = torch.cat([last_hidden, other_hidden])
        # contiguous, as the loader builds batches (a strided view is another compiled case)
        batch = {
            k: (v[:, :cut].float() if v.is_floating_point() else v[:, :cut]).contiguous() for k, v in batch.items()
        }
        teacher = teacher_from_hidden(last_hidden[:, :cut].float(), lm_head.float(), draft.d2t, batch["loss_mask"])
        eager = draft_ttt_loss(draft, batch, teacher, K)
        fast = compiled(twin, batch, teacher, K)
        first = len(traced) if i < 2 else first
        assert len(traced) == first, f"recompiled for shape {tuple(batch['input_ids'].shape)}"
        torch.testing.assert_close(fast.loss, eager.loss, rtol=1e-5, atol=1e-6)
        assert torch.equal(fast.count, eager.count) and torch.equal(fast.correct, eager.correct)
        grads = torch.autograd.grad(eager.loss, [p for _, p in params])
        fast_grads = torch.autograd.grad(fast.loss, twin_params)
        for (name, _), g, fg in zip(params, grads, fast_grads, strict=True):
            torch.testing.assert_close(fg, g, rtol=1e-4, atol=1e-6, msg=name)
