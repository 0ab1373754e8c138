"""GDN's TileLang reverse-walk backward (`kernels.ops.gdn.reverse_bwd`, `LaunchPlan(bwd_grads="reverse")`).

On any machine: the refusals (head dims other than 128, a CPU tensor, KDA or no kept Ag) name their reason in one line;
"auto" takes the walk for bf16 steps of at least AUTO_REVERSE_MIN_TOKEN_HEADS tokens x value heads where it runs.
On an H200 with CPBENCH_TEST_GPU=1 and tilelang 0.1.15 (bf16, K = V = 128, chunk 64):
- the walk's kernel against its torch mirror (`kernels.common.reverse_bwd_torch.reverse_walk`, which CI checks against the
  reference) on identical inputs: three varlen sequences (37, 300, 5 tokens: partial and sub-chunk chunks) walked in
  two-chunk ranges from random end gradients, grouped heads (Hk = 1, H = 2); relative L2 2e-2 per output (the
  kernel rounds its products' operands to bf16, the mirror does not); and each sequence walked as one range, whose
  first step is its partial last chunk and whose next chunks are prefetched (session 24: the partial chunk's rows
  were stored before every thread had staged them);
- a training step through `kernels.forward` under keep "ag" and "ag+states" (the forward walk then keeps its chunk
  states and the backward recomputes none) with bwd_grads "reverse": every gradient (dq, dk, dv, dg, dbeta, dh0)
  against autograd through the fp32 per-token reference at 5e-3 (the issue's bound), varlen with h0 and dht and
  grouped heads, and dense B = 2 with the backward split into one-chunk ranges.
On any machine: "ag+states" keeps the walk's states only ahead of the reverse walk, and h without v_new is refused
by the Triton pass and the Triton backward.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.common.chunk_bwd import chunk_bwd
from kernels.common.reverse_bwd_torch import reverse_walk
from kernels.ops.gdn.reverse_bwd import reverse_bwd_refusal, reverse_bwd_tilelang
from kernels.plan import LaunchPlan
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state
from tests.utils.gdn_reference import gdn_reference_grads
from tests.utils.reverse_walk import kept_for_walk

DIM, BT = 128, 64
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
WHY = reverse_bwd_refusal(DIM, DIM, BT, torch.device(TEST_DEVICE)) if TEST_DEVICE == "cuda" else "no GPU test"
GPU = pytest.mark.skipif(WHY is not None, reason=str(WHY))


def test_refusals_name_their_reason() -> None:
    assert "K = V = 128 and chunk 64, got K=64" in str(reverse_bwd_refusal(64, 128, 64, torch.device("cpu")))
    assert "chunk 64, got K=128 V=128 chunk=32" in str(reverse_bwd_refusal(128, 128, 32, torch.device("cpu")))
    assert "runs on CUDA only, got cpu" in str(reverse_bwd_refusal(128, 128, 64, torch.device("cpu")))
    q, k, v, g, beta, _ = make_inputs("kda", (20,), K=16, V=16)
    with pytest.raises(ValueError, match="bwd_grads='reverse' is GDN's backward from the forward's Ag"):
        chunk_bwd("kda", q, k, v, g, beta, torch.ones_like(v), scale=0.25, plan=LaunchPlan(bwd_grads="reverse"))
    with pytest.raises(
        ValueError, match="LaunchPlan.bwd_grads must be one of auto, pair, fused, reverse, tilelang, got 'stages'"
    ):
        LaunchPlan(bwd_grads="stages")  # session 27's lockstep walk, removed in session 30
    q, k, v, g, beta, _ = make_inputs("gdn", (20,), K=16, V=16)
    with pytest.raises(ValueError, match="got op 'gdn' under recompute"):
        chunk_bwd("gdn", q, k, v, g, beta, torch.ones_like(v), scale=0.25, plan=LaunchPlan(bwd_grads="reverse"))


def test_auto_takes_the_walk_for_long_bf16_steps_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernels.ops.gdn.reverse_bwd as rb
    from kernels.vocabulary import AUTO_REVERSE_MIN_TOKEN_HEADS

    def step(T: int, HV: int = 16, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.empty(1, T, 1, DIM, dtype=dtype, device="meta")
        return k, torch.empty(1, T, HV, DIM, dtype=dtype, device="meta")

    at = AUTO_REVERSE_MIN_TOKEN_HEADS // 16
    assert not rb.auto_reverse(*step(at), BT, LaunchPlan())  # here (a meta tensor): refused, the fused kernels run
    monkeypatch.setattr(rb, "tilelang_refusal_cached", lambda what, K, V, BT, device: None)  # as on an H200 with tilelang
    assert rb.auto_reverse(*step(at), BT, LaunchPlan())
    assert rb.auto_reverse(*step(at // 2, HV=32), BT, LaunchPlan())  # tokens x value heads
    assert not rb.auto_reverse(*step(at - 1), BT, LaunchPlan())  # a short step waits on the host: fused
    assert not rb.auto_reverse(*step(at, dtype=torch.float32), BT, LaunchPlan())  # measured in bf16 only
    assert not rb.auto_reverse(*step(at), BT, LaunchPlan(bwd_grads="fused"))  # asked for


@GPU
@pytest.mark.parametrize("span", [2 * BT, 10**9], ids=["two-chunk-ranges", "whole-sequences"])
def test_kernel_matches_its_torch_mirror(span: int) -> None:
    lengths = (37, 300, 5)
    cu = [0, 37, 337, 342]
    q, k, _, _, _, _ = make_inputs("gdn", lengths, H=1, K=DIM, V=DIM, dtype=torch.bfloat16, device="cuda")
    _, _, v, g, beta, _ = make_inputs("gdn", lengths, H=2, K=DIM, V=DIM, lb=-1.0, seed=3, dtype=torch.bfloat16,
                                      device="cuda")  # fmt: skip
    scale = DIM**-0.5
    h0 = make_state(3, 2, DIM, DIM, device="cuda")
    ag, gs, h, first = kept_for_walk(*(x.float() for x in (q, k, v, g, beta, h0)), cu, BT, scale)
    bounds, offs, fin = [], [], []
    for n in range(3):
        for j, s0 in enumerate(range(cu[n], cu[n + 1], span)):
            bounds.append(s0)
            offs.append(first[n] + (s0 - cu[n]) // BT)
            fin.append(n if j == 0 else -1)
    bounds.append(cu[-1])
    gen = torch.Generator().manual_seed(11)
    do = torch.randn(v.shape, generator=gen).to("cuda", torch.bfloat16)
    ends = 0.1 * torch.randn(len(fin), 2, DIM, DIM, generator=gen).to("cuda")
    args = (q, k, v, g, gs, beta, ag.bfloat16(), h.bfloat16(), do)
    ranges = {"cu": torch.tensor(bounds, device="cuda"), "chunk_offsets": torch.tensor(offs, device="cuda"),
              "ends": ends, "final_idx": torch.tensor(fin, device="cuda"), "num_seqs": 3}  # fmt: skip
    got = reverse_bwd_tilelang(*args, scale=scale, **ranges)
    want = reverse_walk(*args, scale=scale, **ranges)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want, strict=True):
        assert torch.isfinite(a).all(), name
        assert_rel_close(name, b.float(), a.float(), 2e-2)


def _reference(q, k, v, g, beta, h0, do, dht, bounds):
    return gdn_reference_grads(q, k, v, g, beta, h0, do, dht, bounds, scale=DIM**-0.5)


def test_ag_states_keeps_the_walks_states_ahead_of_the_reverse_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under "ag+states" the TileLang forward walk keeps its chunk states (no v_new) where it is the output pass and the
    backward the reverse walk (`fused.walk_keeps_states`); h without v_new is refused by the Triton pass and by the
    Triton backward in one line."""
    import kernels.ops.gdn.fused as fused
    import kernels.ops.gdn.reverse_bwd as rb
    import kernels.ops.gdn.tilelang_hopper as th
    from kernels.common.index import prepare_chunk_index
    from kernels.ops.gdn.ag_bwd import chunk_gdn_bwd_ag

    k = torch.empty(1, 65536, 1, DIM, dtype=torch.bfloat16, device="meta")
    v = torch.empty(1, 65536, 16, DIM, dtype=torch.bfloat16, device="meta")
    assert not fused.walk_keeps_states(k, v, BT, LaunchPlan())  # here (a meta tensor): no walk, Triton keeps h, v_new
    monkeypatch.setattr(th, "tilelang_refusal_cached", lambda what, K, V, BT, device: None)  # as on an H200
    monkeypatch.setattr(rb, "tilelang_refusal_cached", lambda what, K, V, BT, device: None)
    assert fused.walk_keeps_states(k, v, BT, LaunchPlan())  # auto: the walk forward, the reverse walk backward
    assert fused.walk_keeps_states(k[:, :64], v[:, :64], BT, LaunchPlan(bwd_grads="reverse"))  # asked for
    assert not fused.walk_keeps_states(k[:, :64], v[:, :64], BT, LaunchPlan())  # a short step: Triton's backward
    assert not fused.walk_keeps_states(k, v, BT, LaunchPlan(bwd_grads="fused"))
    assert not fused.walk_keeps_states(k, v, BT, LaunchPlan(fwd_pass="triton"))
    monkeypatch.undo()
    q, k, v, g, beta, _ = make_inputs("gdn", B=1, T=70, H=1, K=16, V=16)
    index = prepare_chunk_index(None, batch=1, seq_len=70, chunk_size=BT)
    ag, gs = torch.zeros(1, 70, 1, BT), torch.zeros(1, 70, 1)
    with pytest.raises(ValueError, match="chunk states without v_new are the TileLang walk's"):
        fused.fused_state_output_fwd(q, k, v, ag, gs, scale=0.25, index=index, launch=LaunchPlan(),
                                     hs=k.new_empty(index.num_chunks, 1, 16, 16))  # fmt: skip
    kept = {"ag": ag, "gs": gs, "h": k.new_empty(index.num_chunks, 1, 16, 16), "split": torch.tensor(0)}
    with pytest.raises(ValueError, match=r"without v_new .* this backward \(bwd_grads='auto'\) needs v_new"):
        chunk_gdn_bwd_ag(q, k, v, g, beta, torch.ones_like(v), scale=0.25, wy=kept)


@GPU
@pytest.mark.parametrize("keep", ["ag", "ag+states"])
@pytest.mark.parametrize("case", ["varlen-grouped", "dense-split"])
def test_training_step_through_the_reverse_walk(case: str, keep: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if case == "dense-split":  # the backward split into one-chunk ranges, as the automatic split does at long T
        import kernels.common.seqsplit as seqsplit

        monkeypatch.setattr(seqsplit, "auto_seg_chunks", lambda index, *, H, NV, device: 1)
        q, k, v, g, beta, cu = make_inputs("gdn", B=2, T=300, H=2, K=DIM, V=DIM, lb=-1.0, dtype=torch.bfloat16,
                                           device="cuda")  # fmt: skip
        h0 = dht = None
        bounds = [0, 300, 600]
    else:
        lengths = (37, 300, 5)
        q, k, _, _, _, cu = make_inputs("gdn", lengths, H=1, K=DIM, V=DIM, dtype=torch.bfloat16, device="cuda")
        _, _, v, g, beta, _ = make_inputs("gdn", lengths, H=2, K=DIM, V=DIM, lb=-1.0, seed=5, dtype=torch.bfloat16,
                                          device="cuda")  # fmt: skip
        h0 = make_state(3, 2, DIM, DIM, device="cuda")
        dht = make_state(3, 2, DIM, DIM, seed=9, device="cuda")
        bounds = [0, 37, 337, 342]
    do = torch.randn(v.shape, generator=torch.Generator().manual_seed(4)).to("cuda", torch.bfloat16)
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta)]
    s0 = h0.detach().clone().requires_grad_() if h0 is not None else None
    o, ht = kernels.forward("gdn", *xs, initial_state=s0, output_final_state=True, cu_seqlens=cu, backend="triton",
                            plan=LaunchPlan(keep=keep, bwd_grads="reverse"))  # fmt: skip
    ((o.float() * do.float()).sum() + ((ht * dht).sum() if dht is not None else 0.0)).backward()
    got = [x.grad for x in xs] + [s0.grad if s0 is not None else None]
    for name, a, r in zip(NAMES, got, _reference(q, k, v, g, beta, h0, do, dht, bounds), strict=True):
        if r is None:
            assert a is None, name
            continue
        assert torch.isfinite(a).all(), name
        assert_rel_close(name, r, a.float(), 5e-3)
