"""FLA's keyword arguments of kernels.chunk_gdn / chunk_kda (issue 25): each implemented one against the fp32
per-token reference, forward and backward; every refusal by its message; FLA's defaults passed explicitly.

The expected side writes FLA 0.6.0's formulas out (never kernels.common.gate): the in-kernel gate
`-exp(A_log) * softplus(g + dt_bias)`, the safe gate `lower_bound * sigmoid(exp(A_log) * (g + dt_bias))` (without A_log
`lower_bound * sigmoid(g + dt_bias)`), the in-kernel beta `sigmoid(beta)` (times 2 with allow_neg_eigval), the
`[N, HV, V, K]` state of state_v_first; then autograd through `kernels.reference` in fp64. Inputs are random, varlen
with an initial state, grouped value heads HV = 2H. Tolerance: relative L2 1e-5 for fp32 (torch and triton under the
interpreter, as tests/kernels/common/test_chunk_bwd.py), on o, the final state and every gradient (dq, dk, dv, dg_raw,
dbeta, dh0); 1e-4 for dA_log and ddt_bias, each a sum over all tokens of the fp32 gate gradient (with cancellation).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import kernels
import kernels.dispatch
from kernels.common.index import prepare_chunk_index
from tests.utils import assert_rel_close, make_inputs, make_state

TOL = 1e-5
TOL_SUMMED = 1e-4  # dA_log, ddt_bias: sums of the fp32 dg over every token
H, HV, K, V = 1, 2, 16, 16
LENGTHS = (20, 50)


def _entry(op: str):  # noqa: ANN202
    return kernels.chunk_gdn if op == "gdn" else kernels.chunk_kda


def _leaves(op: str, opts: dict[str, Any], seed: int = 3) -> tuple[dict[str, Tensor], Tensor]:
    """fp64 leaves: q, k (H heads), v, g (raw when the gate is in the kernel), beta (raw logits with the in-kernel
    sigmoid), h0 (in the layout the call asks for), A_log, dt_bias; and cu_seqlens."""
    _, _, v, g, beta, cu = make_inputs(op, LENGTHS, H=HV, K=K, V=V, lb=-3.0, seed=seed)
    q, k, _, _, _, _ = make_inputs(op, LENGTHS, H=H, K=K, V=V, seed=seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    xs = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "h0": make_state(len(LENGTHS), HV, K, V, seed=seed)}
    if opts.get("use_gate_in_kernel"):
        xs["g"] = 2 * torch.randn(g.shape, generator=gen)  # raw gate: either sign
        xs["dt_bias"] = torch.randn(HV if op == "gdn" else HV * K, generator=gen)
        if opts.get("A_log", True) is not None:
            xs["A_log"] = torch.rand(HV, generator=gen) - 2  # g >= -3 or so: the triton KDA's g >= -5.5 of today
    if opts.get("use_beta_sigmoid_in_kernel"):
        xs["beta"] = 2 * torch.randn(beta.shape, generator=gen)
    if opts.get("state_v_first"):
        xs["h0"] = xs["h0"].transpose(-1, -2).contiguous()
    return {n: x.double().requires_grad_() for n, x in xs.items()}, cu


def _fla_gate(op: str, x: dict[str, Tensor], opts: dict[str, Any]) -> Tensor:
    """FLA 0.6.0's gate, written out: naive_gdn_gate / naive_kda_gate / naive_kda_lowerbound_gate."""
    g = x["g"]
    if not opts.get("use_gate_in_kernel"):
        return g
    per_head = (HV,) if op == "gdn" else (HV, 1)
    z = g + x["dt_bias"].view(g.shape[2:])
    lb = opts.get("lower_bound")
    if lb is None:
        return -x["A_log"].exp().view(per_head) * F.softplus(z)
    if "A_log" in x:
        z = x["A_log"].exp().view(per_head) * z
    return lb * torch.sigmoid(z)


def _expected(op: str, x: dict[str, Tensor], cu: Tensor, opts: dict[str, Any]) -> tuple[Tensor, Tensor]:
    beta = x["beta"]
    if opts.get("use_beta_sigmoid_in_kernel"):
        beta = torch.sigmoid(beta) * (2.0 if opts.get("allow_neg_eigval") else 1.0)
    v_first = opts.get("state_v_first", False)
    h0 = x["h0"].transpose(-1, -2) if v_first else x["h0"]
    o, ht = kernels.reference(
        op, x["q"], x["k"], x["v"], _fla_gate(op, x, opts), beta, initial_state=h0, output_final_state=True, cu_seqlens=cu
    )
    return o, (ht.transpose(-1, -2) if v_first else ht)


def _call(op: str, backend: str, x: dict[str, Tensor], cu: Tensor, opts: dict[str, Any]) -> tuple[Tensor, Tensor]:
    extra = {n: x[n] for n in ("A_log", "dt_bias") if n in x}
    o, ht = _entry(op)(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        initial_state=x["h0"],
        output_final_state=True,
        cu_seqlens=cu,
        backend=backend,
        **{**opts, **extra},
    )
    return o, ht


def _grads(x: dict[str, Tensor], o: Tensor, ht: Tensor, do: Tensor, dht: Tensor) -> dict[str, Tensor]:
    ((o.double() * do).sum() + (ht.double() * dht).sum()).backward()
    return {"o": o.detach(), "ht": ht.detach(), **{f"d{n}": t.grad for n, t in x.items()}}  # type: ignore[misc]


def _check(op: str, backend: str, opts: dict[str, Any]) -> None:
    ref_x, cu = _leaves(op, opts)
    got_x = {n: t.detach().float().requires_grad_() for n, t in ref_x.items()}
    o, ht = _expected(op, ref_x, cu, opts)
    gen = torch.Generator().manual_seed(11)
    do, dht = torch.randn(o.shape, generator=gen).double(), torch.randn(ht.shape, generator=gen).double()
    ref = _grads(ref_x, o, ht, do, dht)
    got = _grads(got_x, *_call(op, backend, got_x, cu, opts), do, dht)
    assert set(got) == set(ref) and ("dA_log" in got) == ("A_log" in ref_x)
    for name, want in ref.items():
        assert got[name] is not None, name
        assert_rel_close(name, want, got[name], TOL_SUMMED if name in ("dA_log", "ddt_bias") else TOL)


GATE = {"use_gate_in_kernel": True}
CASES = {
    "gdn-in_kernel_gate": ("gdn", GATE),
    "kda-in_kernel_gate": ("kda", GATE),
    "kda-safe_gate": ("kda", {**GATE, "safe_gate": True, "lower_bound": -4.0}),
    "kda-safe_gate_no_A_log": ("kda", {**GATE, "safe_gate": True, "lower_bound": -3.0, "A_log": None}),
    "kda-lower_bound_without_safe_gate": ("kda", {**GATE, "lower_bound": -2.0}),
    "gdn-beta_sigmoid_neg_eigval": ("gdn", {"use_beta_sigmoid_in_kernel": True, "allow_neg_eigval": True}),
    "kda-beta_sigmoid": ("kda", {"use_beta_sigmoid_in_kernel": True}),
    "gdn-state_v_first": ("gdn", {"state_v_first": True}),
    "kda-state_v_first": ("kda", {"state_v_first": True}),
    "kda-disable_recompute": ("kda", {"disable_recompute": True}),
    "kda-safe_precomputed": ("kda", {"safe_gate": True, "lower_bound": -3.0}),
    "gdn-chunk_size_16": ("gdn", {"chunk_size": 16}),
    "kda-chunk_size_32": ("kda", {**GATE, "chunk_size": 32}),
}
# the triton backend under the interpreter (slow): every argument, in three calls
TRITON_CASES = {
    "gdn-all": (
        "gdn",
        {**GATE, "use_beta_sigmoid_in_kernel": True, "allow_neg_eigval": True, "state_v_first": True, "chunk_size": 16},
    ),
    "kda-all": ("kda", {**GATE, "use_beta_sigmoid_in_kernel": True, "state_v_first": True, "disable_recompute": True}),
    "kda-safe_gate_no_A_log": CASES["kda-safe_gate_no_A_log"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_argument_torch(case: str) -> None:
    op, opts = CASES[case]
    _check(op, "torch", dict(opts))


@pytest.mark.parametrize("case", list(TRITON_CASES))
def test_argument_triton(case: str) -> None:
    op, opts = TRITON_CASES[case]
    _check(op, "triton", dict(opts))


@pytest.mark.parametrize(
    "backend,chunk",
    [("torch", 64), ("triton", 64), ("torch", 32), ("triton", 32)],
    ids=["torch", "triton", "torch-32", "triton-32"],
)
@pytest.mark.parametrize("v_first", [False, True], ids=["kv", "v_first"])
def test_intermediate_states(backend: str, chunk: int, v_first: bool) -> None:
    """FLA's h: the state entering each chunk of chunk_size tokens, `[1, NT, HV, K, V]` (varlen), k's dtype: against
    the reference's final state of each sequence's prefix (h0 for the first chunk); with the in-kernel gate."""
    lengths, op = (37, 150), "kda"
    opts = {**GATE, "state_v_first": v_first, "chunk_size": chunk}
    _, _, v, _, beta, cu = make_inputs(op, lengths, H=HV, K=K, V=V, seed=21)
    q, k, *_ = make_inputs(op, lengths, H=H, K=K, V=V, seed=22)
    gen = torch.Generator().manual_seed(23)
    g_raw, A_log, dt_bias = torch.randn(1, sum(lengths), HV, K, generator=gen), torch.rand(HV) - 2, torch.randn(HV * K)
    h0 = make_state(2, HV, K, V, seed=24)
    g = -A_log.exp().view(HV, 1) * F.softplus(g_raw + dt_bias.view(HV, K))
    want = []
    for n, (bos, eos) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        for start in range(bos, eos, chunk):
            if start == bos:
                want.append(h0[n])
                continue
            sl = slice(bos, start)
            _, s = kernels.reference(
                op, q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], initial_state=h0[n : n + 1], output_final_state=True
            )
            want.append(s[0])
    with torch.inference_mode():
        o, ht, h = kernels.chunk_kda(
            q,
            k,
            v,
            g_raw,
            beta,
            initial_state=h0.transpose(-1, -2) if v_first else h0,
            output_final_state=True,
            cu_seqlens=cu,
            backend=backend,
            A_log=A_log,
            dt_bias=dt_bias,
            return_intermediate_states=True,
            **opts,
        )
    assert h.shape == ((1, len(want), HV, V, K) if v_first else (1, len(want), HV, K, V)) and h.dtype == k.dtype
    assert_rel_close("h", torch.stack(want)[None], h.transpose(-1, -2) if v_first else h, TOL)
    o_ref, ht_ref = kernels.reference(op, q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht.transpose(-1, -2) if v_first else ht, TOL)


def test_intermediate_states_dense_shape() -> None:
    q, k, v, g, beta, _ = make_inputs("kda", B=2, T=130, H=2, K=16, V=8)
    with torch.inference_mode():
        o, ht, h = kernels.chunk_kda(q, k, v, g, beta, backend="torch", return_intermediate_states=True)
    assert ht is None and h.shape == (2, 3, 2, 16, 8)
    _, s = kernels.reference("kda", q[:, :64], k[:, :64], v[:, :64], g[:, :64], beta[:, :64], output_final_state=True)
    assert_rel_close("h[:, 1]", s, h[:, 1], TOL)
    assert bool((h[:, 0] == 0).all())


def test_fla_defaults_passed_explicitly_are_accepted() -> None:
    for op in ("gdn", "kda"):
        q, k, v, g, beta, cu = make_inputs(op, (30, 40), H=2, K=16, V=8)
        plain = _entry(op)(q, k, v, g, beta, cu_seqlens=cu, backend="torch")[0]
        defaults = {
            "A_log": None,
            "dt_bias": None,
            "cu_seqlens_cpu": None,
            "chunk_indices": None,
            "cp_context": None,
            "chunk_size": 64,
            "use_gate_in_kernel": False,
            "use_beta_sigmoid_in_kernel": False,
            "allow_neg_eigval": False,
            "state_v_first": False,
            "safe_gate": False,
            "lower_bound": None,
            "disable_recompute": False,
            "return_intermediate_states": False,
            "use_graph": False,
            "max_num_seqs": None,
            "use_qk_l2norm_in_kernel": False,
            "scale": None,
            "initial_state": None,
        }
        o = _entry(op)(q, k, v, g, beta, cu_seqlens=cu, backend="torch", **defaults)[0]
        assert torch.equal(plain, o), op


def test_chunk_indices_cu_seqlens_cpu_and_max_num_seqs() -> None:
    q, k, v, g, beta, cu = make_inputs("kda", (30, 100), H=2, K=16, V=8)
    plain = kernels.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, backend="torch")[0]
    ci = prepare_chunk_index(cu, batch=1, seq_len=130).chunk_indices.long()  # FLA's [NT, 2] (sequence, chunk)
    o = kernels.chunk_kda(
        q,
        k,
        v,
        g,
        beta,
        cu_seqlens=cu,
        backend="torch",
        chunk_indices=ci,
        cu_seqlens_cpu=torch.tensor([0, 30, 130]),
        max_num_seqs=8,
    )[0]
    assert torch.equal(plain, o) and ci.tolist() == [[0, 0], [1, 0], [1, 1]]


def test_transpose_state_layout_is_state_v_first_with_a_warning() -> None:
    q, k, v, g, beta, cu = make_inputs("gdn", (30, 40), H=2, K=16, V=8)
    h0 = make_state(2, 2, 8, 16)
    a = kernels.chunk_gdn(
        q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True, backend="torch", state_v_first=True
    )
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        b = kernels.chunk_gdn(
            q,
            k,
            v,
            g,
            beta,
            cu_seqlens=cu,
            initial_state=h0,
            output_final_state=True,
            backend="torch",
            transpose_state_layout=True,
        )
    assert a[1].shape == (2, 2, 8, 16) and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def _args(op: str, **over: Any) -> dict[str, Any]:
    q, k, v, g, beta, cu = make_inputs(op, (30, 40), H=2, K=16, V=8)
    args: dict[str, Any] = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "cu_seqlens": cu, "backend": "torch"}
    args.update(over)
    return args


A2, B2 = torch.zeros(2), torch.zeros(2 * 16)
REFUSED = [
    ("gdn", {"chunk_size": 128}, r"^chunk_size must be one of \(16, 32, 64\) for chunk_gdn \(FLA's\), got chunk_size=128"),
    ("kda", {"chunk_size": 16}, r"^chunk_size must be one of \(32, 64\) for chunk_kda"),
    ("kda", {"cp_context": object()}, r"^cp_context=<object.*is not supported by chunk_kda.*use kernels.cp.forward"),
    ("kda", {"use_graph": True}, r"^use_graph=True is not supported by chunk_kda"),
    ("kda", {"max_num_seqs": 0}, r"^max_num_seqs must be None or a positive int, got max_num_seqs=0"),
    ("gdn", {"head_first": False}, r"^head_first=False is not accepted: FLA removed head_first"),
    ("gdn", {"safe_gate": True}, r"^safe_gate=True is a chunk_kda option: FLA's chunk_gated_delta_rule ignores it"),
    ("gdn", {"return_intermediate_states": True}, r"^return_intermediate_states=True is a chunk_kda option"),
    ("kda", {"use_gate": True}, r"^chunk_kda got an unexpected argument use_gate=True"),
    ("kda", {"safe_gate": 1}, r"^safe_gate must be a bool, got safe_gate=1"),
    ("kda", {"A_log": A2}, r"^A_log is given but use_gate_in_kernel=False: FLA would ignore it"),
    ("gdn", {"dt_bias": torch.zeros(2)}, r"^dt_bias is given but use_gate_in_kernel=False"),
    ("gdn", {"use_gate_in_kernel": True}, r"^A_log=None with use_gate_in_kernel=True: .* needs A_log \(shape \[HV\]\)$"),
    ("kda", {"use_gate_in_kernel": True, "dt_bias": B2}, r"^A_log=None with use_gate_in_kernel=True: .*unless lower_bound"),
    (
        "kda",
        {"use_gate_in_kernel": True, "safe_gate": True, "A_log": A2},
        r"^safe_gate=True with use_gate_in_kernel=True needs lower_bound",
    ),
    (
        "kda",
        {"use_gate_in_kernel": True, "safe_gate": True, "lower_bound": -6.0, "A_log": A2},
        r"^lower_bound must be in FLA's safe range \[-5, 0\)",
    ),
    (
        "kda",
        {"use_gate_in_kernel": True, "lower_bound": float("-inf"), "A_log": A2},
        r"^lower_bound must be a finite float <= 0",
    ),
    (
        "kda",
        {"use_gate_in_kernel": True, "lower_bound": 1.0, "A_log": A2},
        r"^lower_bound must be a finite float <= 0 .*got lower_bound=1.0",
    ),
    ("kda", {"lower_bound": -5.0}, r"^lower_bound=-5.0 has no effect without use_gate_in_kernel=True or safe_gate=True"),
    (
        "kda",
        {"safe_gate": True, "lower_bound": -1.0},
        r"^g must be >= lower_bound=-1.0 everywhere \(safe_gate=True promises it\)",
    ),
    ("gdn", {"allow_neg_eigval": True}, r"^allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"),
    (
        "kda",
        {"return_intermediate_states": True},
        r"^return_intermediate_states=True is allowed only under torch.inference_mode\(\)",
    ),
    (
        "kda",
        {"state_v_first": True, "transpose_state_layout": True},
        r"^chunk_kda got both state_v_first=True and the deprecated",
    ),
    (
        "kda",
        {"use_gate_in_kernel": True, "A_log": torch.zeros(3)},
        r"^A_log must hold \[HV\] = 2 elements \(HV=2, K=16\), got A_log.shape=\(3,\)",
    ),
    (
        "kda",
        {"use_gate_in_kernel": True, "A_log": A2, "dt_bias": torch.zeros(2)},
        r"^dt_bias must hold \[HV \* K\] = 32 elements",
    ),
    (
        "gdn",
        {"use_gate_in_kernel": True, "A_log": torch.zeros(2, dtype=torch.int64)},
        r"^A_log must be a float torch.Tensor of shape \[HV\], got A_log=torch.int64",
    ),
    (
        "kda",
        {"chunk_indices": torch.zeros(3, 2, dtype=torch.int64)},
        r"^chunk_indices must be an int32/int64 tensor \[NT, 2\] = \(2, 2\)",
    ),
    ("kda", {"chunk_indices": torch.tensor([[0, 0], [0, 1]])}, r"^chunk_indices does not match cu_seqlens"),
    ("kda", {"chunk_indices": torch.tensor([[0, 0]]), "cu_seqlens": None}, r"^chunk_indices is given without cu_seqlens"),
    (
        "kda",
        {"state_v_first": True, "initial_state": torch.zeros(2, 2, 16, 8)},
        r"^initial_state must have shape \[N, H, V, K\] = \(2, 2, 8, 16\)",
    ),
]


@pytest.mark.parametrize("op,over,match", [pytest.param(*r, id=f"{r[0]}-{'-'.join(r[1])}") for r in REFUSED])
def test_refusals(op: str, over: dict[str, Any], match: str) -> None:
    args = _args(op, **over)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match=match):
            _entry(op)(**args)


def test_intermediate_states_refusals() -> None:
    with (
        torch.inference_mode(),
        pytest.raises(ValueError, match=r"^return_intermediate_states=True cannot be combined with disable_recompute"),
    ):
        kernels.chunk_kda(**_args("kda"), return_intermediate_states=True, disable_recompute=True)
    with torch.inference_mode(), pytest.raises(ValueError, match=r"^return_intermediate_states=True needs backend 'torch'"):
        kernels.chunk_kda(**{**_args("kda"), "backend": "reference"}, return_intermediate_states=True)


def test_fla_backend_passes_every_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fla backend hands FLA the options as given (FLA itself needs a GPU: a stand-in records the call)."""
    seen: dict[str, Any] = {}

    def fake(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, **kw: Any) -> tuple[Tensor, ...]:
        seen.update(kw)
        return v.clone(), None, torch.zeros(1)

    monkeypatch.setattr("kernels.backends.fla_op", lambda op: fake)
    args = _args("kda", backend="fla")
    with torch.inference_mode():
        o, ht, h = kernels.chunk_kda(
            **args,
            use_gate_in_kernel=True,
            A_log=A2,
            dt_bias=B2,
            safe_gate=True,
            lower_bound=-5.0,
            use_beta_sigmoid_in_kernel=True,
            state_v_first=True,
            return_intermediate_states=True,
        )
    assert ht is None and h.shape == (1,)
    assert seen["A_log"] is A2 and seen["dt_bias"] is B2 and seen["lower_bound"] == -5.0
    assert all(
        seen[n] is True
        for n in (
            "use_gate_in_kernel",
            "safe_gate",
            "use_beta_sigmoid_in_kernel",
            "state_v_first",
            "return_intermediate_states",
        )
    )


def test_disable_recompute_is_the_keep_everything_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    real = kernels.dispatch.checked_forward

    def spy(*a: Any, **kw: Any) -> Any:
        seen.append(kw["plan"].keep)
        return real(*a, **kw)

    monkeypatch.setattr(kernels.dispatch, "checked_forward", spy)
    kernels.chunk_kda(**_args("kda"), disable_recompute=True)
    kernels.chunk_kda(**_args("kda"), disable_recompute=False, plan=kernels.LaunchPlan(keep="wy"))
    assert seen == ["wy+states", "wy"]
