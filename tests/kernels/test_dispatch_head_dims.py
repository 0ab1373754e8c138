"""Any head dim K, V <= 256 on the Triton backend, and GDN's chunk sizes 16 and 32 (FLA's `chunk_size`), against
the fp32 per-token reference (interpreted on CPU; on a GPU with CPBENCH_TEST_GPU=1).

Head dims: K = V in {60, 100, 128} (FLA's own test cases use 60 and 100; 128 is the benchmarked shape) and K != V
(60, 100): masked power-of-two tiles (`kernels.configs.head_block`). For both ops: the forward (o, final state)
dense and varlen with an initial state, the backward (every gradient, varlen with h0 and dht, the reverse pass
split into one-chunk segments so the transition, chain and ext kernels run too), and `kernels.transition`
(M S0 + S_ext == the final state from S0; plain and split, which folds the segment maps). The kernel tests run
with NaN-poisoned allocations (tests/kernels/conftest.py): a column past K or V left unwritten inside a tensor
the caller reads shows up as NaN.
Chunk sizes: chunk_size 16 and 32 (FLA's argument of GDN; KDA too), forward and backward, triton and torch, against
the reference (varlen with h0 and dht, split into one-chunk segments; the lengths scaled with the chunk size).
Tolerance: 1e-5 relative L2 on CPU (the interpreter computes dots in IEEE fp32; measured <= 1e-6); 1e-2 on a GPU
(tf32 products; bf16-free inputs here).
"""

from __future__ import annotations

import importlib

import pytest
import torch

import kernels
from kernels.common.chunk_bwd import chunk_bwd
from kernels.common.chunk_bwd_torch import chunk_bwd_torch
from kernels.common.chunk_torch import chunk_fwd_torch
from kernels.common.index import prepare_chunk_index
from kernels.common.transition_triton import chunk_transition_fwd
from kernels.validate import check_kernel_dims
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state

DEVICE = TEST_DEVICE
TOL = 1e-5 if DEVICE == "cpu" else 1e-2
LB = -0.1  # slow decay: the initial state and the segment maps matter
DIMS = [(60, 60), (100, 100), (128, 128), (60, 100)]
LENGTHS = (37, 70)  # a partial chunk and one crossing a chunk edge
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def _ids(dims: tuple[int, int]) -> str:
    return f"K{dims[0]}-V{dims[1]}"


def _reference_grads(op, q, k, v, g, beta, h0, do, dht, bounds):
    """Autograd through the per-token reference in fp32: (dq, dk, dv, dg, dbeta, dh0)."""
    xs = [x.detach().float().clone().requires_grad_() for x in (q, k, v, g, beta)]
    s0 = h0.detach().clone().requires_grad_()
    cu = torch.tensor(bounds, dtype=torch.int32, device=q.device) if bounds is not None else None
    o, ht = kernels.reference(op, *xs, initial_state=s0, output_final_state=True, cu_seqlens=cu)
    ((o * do.float()).sum() + (ht * dht).sum()).backward()
    return [x.grad for x in xs] + [s0.grad]


def _check_grads(got, ref, tol=TOL):
    for name, a, r in zip(NAMES, got, ref, strict=True):
        assert torch.isfinite(a).all(), f"{name}: non-finite (an unwritten masked column?)"
        assert_rel_close(name, r, a.float(), tol)


def _grad_case(op: str, K: int, V: int, lengths=LENGTHS, seed: int = 3):
    q, k, v, g, beta, cu = make_inputs(op, lengths, H=1, K=K, V=V, lb=LB, device=DEVICE)
    h0 = make_state(len(lengths), 1, K, V, device=DEVICE)
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(v.shape, generator=gen).to(DEVICE)
    dht = torch.randn(h0.shape, generator=gen).to(DEVICE)
    return q, k, v, g, beta, cu, h0, do, dht


# ---------------------------------------------------------------------------------------------------------------------
# head dims


def test_head_dim_rule() -> None:
    for K, V in ((1, 1), (60, 100), (100, 60), (256, 256), (17, 255)):
        check_kernel_dims("triton", K, V)
    for K, V, name in ((257, 64, "K=257"), (64, 300, "V=300"), (0, 64, "K=0")):
        with pytest.raises(ValueError, match=name):
            check_kernel_dims("triton", K, V)
    check_kernel_dims("torch", 300, 300)  # the torch backend takes any head dim


@pytest.mark.parametrize("OP", ["gdn", "kda"])
@pytest.mark.parametrize("dims", DIMS, ids=_ids)
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_head_dims_forward(OP: str, dims: tuple[int, int], varlen: bool) -> None:
    K, V = dims
    if varlen:
        q, k, v, g, beta, cu = make_inputs(OP, LENGTHS, H=1, K=K, V=V, lb=LB, device=DEVICE)
    else:
        q, k, v, g, beta, cu = make_inputs(OP, B=2, T=70, H=1, K=K, V=V, lb=LB, device=DEVICE)
    h0 = make_state(2, 1, K, V, device=DEVICE)
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    o, ht = kernels.forward(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True, backend="triton")
    assert o.shape == o_ref.shape and ht.shape == ht_ref.shape
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)


@pytest.mark.parametrize("OP", ["gdn", "kda"])
@pytest.mark.parametrize("dims", DIMS, ids=_ids)
def test_head_dims_backward(OP: str, dims: tuple[int, int]) -> None:
    K, V = dims
    q, k, v, g, beta, cu, h0, do, dht = _grad_case(OP, K, V)
    bwd = getattr(importlib.import_module(f"kernels.ops.{OP}.chunk"), f"chunk_{OP}_bwd")
    got = bwd(q, k, v, g, beta, do, scale=K**-0.5, initial_state=h0, dht=dht, cu_seqlens=cu, split_chunks=1)
    _check_grads(got, _reference_grads(OP, q, k, v, g, beta, h0, do, dht, cu.tolist()))


@pytest.mark.parametrize("OP", ["gdn", "kda"])
@pytest.mark.parametrize("dims", [(60, 100), (100, 60)], ids=_ids)
@pytest.mark.parametrize("split", [0, 1], ids=["plain", "split1"])
def test_head_dims_transition(OP: str, dims: tuple[int, int], split: int) -> None:
    K, V = dims
    q, k, v, g, beta, cu = make_inputs(OP, LENGTHS, H=1, K=K, V=V, lb=LB, device=DEVICE)
    S0 = make_state(len(LENGTHS), 1, K, V, device=DEVICE)
    _, ht_ref = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=S0, output_final_state=True)
    if split == 0:
        M, S_ext = kernels.transition(OP, k, v, g, beta, cu_seqlens=cu, backend="triton")
    else:
        M, S_ext = chunk_transition_fwd(OP, k, v, g, beta, cu_seqlens=cu, split_chunks=split)
    assert M.shape == (len(LENGTHS), 1, K, K) and S_ext.shape == (len(LENGTHS), 1, K, V)
    assert_rel_close("M S0 + S_ext", ht_ref, M @ S0 + S_ext, TOL)


# ---------------------------------------------------------------------------------------------------------------------
# chunk sizes (FLA's chunk_size of GDN; KDA's kernels take them too)


def _fwd(op: str):
    return getattr(importlib.import_module(f"kernels.ops.{op}.chunk"), f"chunk_{op}_fwd")


def _lengths_at(chunk_size: int) -> tuple[int, ...]:
    """LENGTHS scaled by chunk_size / 64, rounded up: a sequence shorter than a chunk and one crossing a chunk edge
    at every chunk size, in as many chunks as at 64 (the interpreter's time grows with the chunks)."""
    return tuple(-(-n * chunk_size // 64) for n in LENGTHS)


def _torch_gate(op: str, g: torch.Tensor) -> torch.Tensor:
    return g.unsqueeze(-1) if op == "gdn" else g  # the torch path's [B, T, H, Kg] gate


@pytest.mark.parametrize("OP", ["gdn", "kda"])
@pytest.mark.parametrize("chunk_size", [16, 32])
def test_chunk_size_forward(OP: str, chunk_size: int) -> None:
    q, k, v, g, beta, cu = make_inputs(OP, _lengths_at(chunk_size), H=2, K=32, V=32, lb=LB, device=DEVICE)
    h0 = make_state(len(LENGTHS), 2, 32, 32, device=DEVICE)
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    common = {"scale": 32**-0.5, "initial_state": h0, "output_final_state": True}
    o, ht = _fwd(OP)(q, k, v, g, beta, cu_seqlens=cu, chunk_size=chunk_size, split_chunks=1, **common)
    assert_rel_close("o triton", o_ref, o, TOL)
    assert_rel_close("ht triton", ht_ref, ht, TOL)
    index = prepare_chunk_index(cu, batch=1, seq_len=q.shape[1], chunk_size=chunk_size, device=q.device)
    o_t, ht_t = chunk_fwd_torch(q, k, v, _torch_gate(OP, g), beta, index=index, **common)
    assert_rel_close("o torch", o_ref, o_t, TOL)
    assert_rel_close("ht torch", ht_ref, ht_t, TOL)


@pytest.mark.parametrize("OP", ["gdn", "kda"])
@pytest.mark.parametrize("chunk_size", [16, 32])
def test_chunk_size_backward(OP: str, chunk_size: int) -> None:
    q, k, v, g, beta, cu, h0, do, dht = _grad_case(OP, 32, 32, _lengths_at(chunk_size))
    ref = _reference_grads(OP, q, k, v, g, beta, h0, do, dht, cu.tolist())
    common = {"scale": 32**-0.5, "initial_state": h0, "dht": dht}
    got = chunk_bwd(OP, q, k, v, g, beta, do, cu_seqlens=cu, split_chunks=1, chunk_size=chunk_size, **common)
    _check_grads(got, ref)
    index = prepare_chunk_index(cu, batch=1, seq_len=q.shape[1], chunk_size=chunk_size, device=q.device)
    dq, dk, dv, dg, dbeta, dh0 = chunk_bwd_torch(q, k, v, _torch_gate(OP, g), beta, do, index=index, **common)
    _check_grads((dq, dk, dv, dg.squeeze(-1) if OP == "gdn" else dg, dbeta, dh0), ref)


@pytest.mark.parametrize("OP", ["gdn", "kda"])
@pytest.mark.parametrize("dims", [(60, 100), (8, 20)], ids=_ids)
def test_head_dims_unfused_and_kept(OP: str, dims: tuple[int, int]) -> None:
    """The unfused output pass and the forward that keeps the WY factors and chunk states for the backward
    (`keep_states`, both split into one-chunk segments), for a head dim past and one below the 16-wide tile."""
    K, V = dims
    q, k, v, g, beta, cu, h0, do, dht = _grad_case(OP, K, V)
    fwd = _fwd(OP)
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    common = {"scale": K**-0.5, "initial_state": h0, "output_final_state": True, "cu_seqlens": cu, "split_chunks": 1}
    o, ht = fwd(q, k, v, g, beta, fuse_output=False, **common)
    assert_rel_close("o unfused", o_ref, o, TOL)
    assert_rel_close("ht unfused", ht_ref, ht, TOL)
    keep: dict[str, torch.Tensor] = {}
    o, ht = fwd(q, k, v, g, beta, keep=keep, keep_states=True, **common)
    assert_rel_close("o kept", o_ref, o, TOL)
    assert_rel_close("ht kept", ht_ref, ht, TOL)
    got = chunk_bwd(OP, q, k, v, g, beta, do, scale=K**-0.5, initial_state=h0, dht=dht, cu_seqlens=cu, wy=keep)
    _check_grads(got, _reference_grads(OP, q, k, v, g, beta, h0, do, dht, cu.tolist()))
