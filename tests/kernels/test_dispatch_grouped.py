"""Grouped value heads on the Triton backend (q, k with H heads; v, g, beta and the state with HV = G * H): the kernels
read the shared q/k head (h // G) and the backward sums dq, dk over each group, with no expanded copy of q or k.

Checked against an oracle built by hand: q and k expanded with repeat_interleave (query/key head h // G serves value
head h), then autograd through the fp32 per-token reference; G = 2 and 4, GDN and KDA, dense with an initial state and
varlen (lengths not multiples of 64, one shorter than a chunk), the intra-device split with the unfused output pass,
and the forward's kept WY factors and states. Tolerance 1e-5 relative L2 on CPU (the interpreter's fp32 dots are
IEEE fp32, as tests/kernels/common/test_chunk_bwd.py); 5e-3 on a GPU (tf32 and bf16 products).
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

import kernels
from kernels.plan import LaunchPlan
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state

DEVICE = TEST_DEVICE
TOL = 1e-5 if DEVICE == "cpu" else 5e-3
K, V = 16, 16
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0", "o", "ht")


def _inputs(op: str, H: int, HV: int, lengths: tuple[int, ...] | None, B: int = 2, T: int = 80) -> tuple[Any, ...]:
    """fp32 inputs (q, k of H heads; v, g, beta, h0 of HV heads), cu_seqlens or None, a random do and dht."""
    shape: dict[str, Any] = {"B": B, "T": T} if lengths is None else {}
    _, _, v, g, beta, cu = make_inputs(op, lengths, H=HV, K=K, V=V, lb=-1.0, seed=3, device=DEVICE, **shape)
    q, k, _, _, _, _ = make_inputs(op, lengths, H=H, K=K, V=V, seed=4, device=DEVICE, **shape)
    n = v.shape[0] if cu is None else cu.numel() - 1
    h0 = make_state(n, HV, K, V, device=DEVICE)
    gen = torch.Generator().manual_seed(11)
    do = torch.randn(*v.shape, generator=gen).to(DEVICE)
    dht = torch.randn(*h0.shape, generator=gen).to(DEVICE)
    return (q, k, v, g, beta, h0), cu, do, dht


def _oracle(op: str, xs: tuple[Tensor, ...], cu: Tensor | None, do: Tensor, dht: Tensor) -> list[Tensor]:
    """The gradients, o and ht by autograd through the per-token reference on q, k expanded by hand."""
    leaves = [x.detach().clone().requires_grad_() for x in xs]
    q, k, v, g, beta, h0 = leaves
    G = v.shape[2] // q.shape[2]
    o, ht = kernels.reference(
        op,
        q.repeat_interleave(G, 2),
        k.repeat_interleave(G, 2),
        v,
        g,
        beta,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=cu,
    )
    ((o * do).sum() + (ht * dht).sum()).backward()
    return [x.grad for x in leaves] + [o.detach(), ht.detach()]


def _triton(
    op: str, xs: tuple[Tensor, ...], cu: Tensor | None, do: Tensor, dht: Tensor, plan: LaunchPlan | None = None
) -> list[Tensor]:
    leaves = [x.detach().clone().requires_grad_() for x in xs]
    entry = kernels.chunk_gdn if op == "gdn" else kernels.chunk_kda
    o, ht = entry(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu, backend="triton", plan=plan)
    ((o * do).sum() + (ht * dht).sum()).backward()
    return [x.grad for x in leaves] + [o.detach(), ht.detach()]


def _check(ref: list[Tensor], got: list[Tensor], tol: float = TOL) -> None:
    for name, r, x in zip(NAMES, ref, got, strict=True):
        assert x.shape == r.shape, f"{name}: shape {tuple(x.shape)}, expected {tuple(r.shape)}"
        assert_rel_close(name, r, x, tol)


@pytest.mark.parametrize("OP", ["gdn", "kda"])
@pytest.mark.parametrize(
    "lengths,H,HV",
    [
        pytest.param(None, 2, 4, id="dense-HV=2H"),
        pytest.param(None, 1, 4, id="dense-HV=4H"),
        pytest.param((37, 100, 5), 2, 4, id="varlen-HV=2H"),
        # ~10 s a case under the interpreter; its paths run in CI in varlen-HV=2H (the varlen kernels, grouped) and
        # dense-HV=4H (groups of 4)
        pytest.param((37, 100, 5), 1, 4, id="varlen-HV=4H", marks=pytest.mark.heavy),
    ],
)
def test_grouped_heads_forward_and_backward(OP: str, H: int, HV: int, lengths: tuple[int, ...] | None) -> None:
    xs, cu, do, dht = _inputs(OP, H, HV, lengths)
    _check(_oracle(OP, xs, cu, do, dht), _triton(OP, xs, cu, do, dht))


@pytest.mark.parametrize("OP", ["gdn", "kda"])
@pytest.mark.parametrize("keep", ["wy", "wy+states"])
def test_grouped_heads_with_what_the_forward_kept(OP: str, keep: str) -> None:
    xs, cu, do, dht = _inputs(OP, 1, 2, (70, 45))
    _check(_oracle(OP, xs, cu, do, dht), _triton(OP, xs, cu, do, dht, plan=LaunchPlan(keep=keep)))


@pytest.mark.parametrize("OP", ["gdn", "kda"])
def test_grouped_heads_split_and_unfused_output(OP: str) -> None:
    """The intra-device split (transition pass, segment chain) and the output pass, forward and backward, G = 2."""
    xs, cu, do, dht = _inputs(OP, 2, 4, (10, 190, 50))
    q, k, v, g, beta, h0 = xs
    chunk = importlib.import_module(f"kernels.ops.{OP}.chunk")
    o, ht = getattr(chunk, f"chunk_{OP}_fwd")(
        q,
        k,
        v,
        g,
        beta,
        scale=K**-0.5,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=cu,
        split_chunks=1,
        fuse_output=False,
    )
    grads = getattr(chunk, f"chunk_{OP}_bwd")(
        q, k, v, g, beta, do, scale=K**-0.5, initial_state=h0, dht=dht, cu_seqlens=cu, split_chunks=1
    )
    _check(_oracle(OP, xs, cu, do, dht), [*grads, o, ht])


class _ExpansionSpy(TorchDispatchMode):
    """Records every aten op that makes a tensor of the expanded shape `[B, T, HV, K]` out of q's or k's data: the data
    is followed through the ops that only move it (views, expand, clone, copies, gathers), so a repeat_interleave,
    which reaches the dispatcher as unsqueeze -> expand -> clone -> view, is seen whatever its form."""

    MOVES = frozenset(
        {
            "view",
            "_unsafe_view",
            "reshape",
            "unsqueeze",
            "squeeze",
            "expand",
            "clone",
            "contiguous",
            "copy_",
            "_to_copy",
            "alias",
            "detach",
            "slice",
            "select",
            "permute",
            "transpose",
            "as_strided",
            "index_select",
            "index",
            "repeat",
            "repeat_interleave",
            "cat",
            "stack",
        }
    )

    def __init__(self, sources: tuple[Tensor, ...], expanded: tuple[int, ...]) -> None:
        super().__init__()
        self.tainted = {x.untyped_storage().data_ptr() for x in sources}
        self.expanded = expanded
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        flat = [*args, *(kwargs or {}).values()]
        ins = [a for x in flat for a in (x if isinstance(x, (list, tuple)) else [x]) if isinstance(a, Tensor)]
        if func.overloadpacket.__name__ in self.MOVES and any(a.untyped_storage().data_ptr() in self.tainted for a in ins):
            for o in out if isinstance(out, (list, tuple)) else [out]:
                if isinstance(o, Tensor):
                    self.tainted.add(o.untyped_storage().data_ptr())
                    if tuple(o.shape) == self.expanded:
                        self.seen.append(str(func))
        return out


@pytest.mark.parametrize("OP", ["gdn", "kda"])
def test_no_expanded_copy_of_q_or_k(OP: str) -> None:
    """Forward and backward on the triton backend make no [B, T, HV, K] copy of q or k (no repeat_interleave); the
    torch backend, a reference, still expands (so the spy does see an expansion)."""
    xs, cu, do, dht = _inputs(OP, 1, 4, (40, 30))
    entry = kernels.chunk_gdn if OP == "gdn" else kernels.chunk_kda
    for backend in ("triton", "torch"):
        leaves = [x.detach().clone().requires_grad_() for x in xs]
        spy = _ExpansionSpy((leaves[0], leaves[1]), (*leaves[0].shape[:2], xs[2].shape[2], K))
        with spy:
            o, ht = entry(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu, backend=backend)
            ((o * do).sum() + (ht * dht).sum()).backward()
        assert bool(spy.seen) == (backend == "torch"), f"{backend}: expansions {spy.seen}"
