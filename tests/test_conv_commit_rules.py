"""Rules of the commit's conv-history update (pallas_kernels/conv_commit) and of its use in the model
(jaxspec/model.py window_rows, the prefill's commit_n path), each against a definition written out in numpy or in
plain Python.

The contract: row r of a layer's new history is row clip(win[b, r]) of concat(history, conv_in), passed through
conv_in's dtype and returned in the history's; a sequence not kept keeps its history; arguments of other shapes or
dtypes are refused, naming the argument. The kernel (interpret mode) follows the same contract, also for indices
past either end, mixed dtypes and several channel blocks; its Triton lowering aliases each history to its output,
its body reads every row before writing any when its buffers are shared, and its tiling helper and its dispatch
are checked directly.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental import pallas as pl

from jaxspec import tree as trees
from jaxspec.config import FULL, LINEAR, TargetConfig
from jaxspec.model import Qwen35, init_state, window_rows
from pallas_kernels.conv_commit import api, pallas_triton, reference


def numpy_commit(hists, conv_ins, win, keep, via=None):
    """The contract in numpy: each kept sequence's rows of concat(history, conv_in) at the clipped indices, the
    history rows rounded through `via` (conv_in's dtype) first; the result in the histories' dtype."""
    out = []
    for h, x in zip(hists, conv_ins):
        hn = np.asarray(h.astype(jnp.float32))
        hv = hn if via is None else np.asarray(jnp.asarray(hn).astype(via).astype(jnp.float32))
        ext = np.concatenate([hv, np.asarray(x.astype(jnp.float32))], 1)
        w = np.clip(np.asarray(win), 0, ext.shape[1] - 1)
        new = hn.copy()
        for b in range(hn.shape[0]):
            if keep[b]:
                new[b] = ext[b, w[b]]
        out.append(np.asarray(jnp.asarray(new).astype(h.dtype).astype(jnp.float32)))
    return out


def inputs(seed, layers, b, km1, n, c, h_dtype=jnp.float32, x_dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    hists = tuple(jnp.asarray(rng.standard_normal((b, km1, c)) * 3, h_dtype) for _ in range(layers))
    conv_ins = tuple(jnp.asarray(rng.standard_normal((b, n, c)) * 3, x_dtype) for _ in range(layers))
    return hists, conv_ins


def as_np(xs):
    return [np.asarray(x.astype(jnp.float32)) for x in xs]


def test_refuses_histories_of_different_shapes(seed):
    """Histories of one dtype but different row counts or channels are refused, not committed."""
    hists, conv_ins = inputs(seed, 2, 2, 3, 4, 8)
    win, keep = jnp.zeros((2, 3), jnp.int32), jnp.ones((2,), bool)
    short = (hists[0], hists[1][:, :2])
    with pytest.raises(ValueError, match="hists must be"):
        reference.conv_commit(short, conv_ins, win, keep)
    with pytest.raises(ValueError, match="hists must be"):
        reference.conv_commit((hists[0], hists[1][:, :, :4]), conv_ins, win, keep)


@pytest.mark.parametrize("bad", ["batch", "channels", "no_nodes", "dtype"])
def test_refuses_conv_ins_that_do_not_match(seed, bad):
    """conv_ins with another batch, other channels (in every layer alike), no nodes, or dtypes that differ
    between layers are refused, naming conv_ins."""
    hists, conv_ins = inputs(seed, 2, 2, 3, 4, 8)
    win, keep = jnp.zeros((2, 3), jnp.int32), jnp.ones((2,), bool)
    x = {"batch": tuple(x[:1] for x in conv_ins),
         "channels": tuple(x[:, :, :4] for x in conv_ins),
         "no_nodes": tuple(x[:, :0] for x in conv_ins),
         "dtype": (conv_ins[0], conv_ins[1].astype(jnp.bfloat16))}[bad]
    with pytest.raises(ValueError, match="conv_ins must be"):
        reference.conv_commit(hists, x, win, keep)
    with pytest.raises(ValueError, match="conv_ins must be"):
        pallas_triton.conv_commit(hists, x, win, keep, interpret=True)


def test_refuses_win_and_keep_of_other_shapes(seed):
    """win must be [B, K-1] and keep [B]: a window of another length or a keep that would broadcast is refused
    rather than making histories of another shape or applying one flag to every sequence."""
    hists, conv_ins = inputs(seed, 2, 2, 3, 4, 8)
    win, keep = jnp.zeros((2, 3), jnp.int32), jnp.ones((2,), bool)
    for w in (jnp.zeros((2, 4), jnp.int32), jnp.zeros((2, 2), jnp.int32), jnp.zeros((1, 3), jnp.int32)):
        with pytest.raises(ValueError, match="win"):
            reference.conv_commit(hists, conv_ins, w, keep)
    for k in (jnp.ones((1,), bool), jnp.ones((2, 1), bool)):
        with pytest.raises(ValueError, match="keep"):
            reference.conv_commit(hists, conv_ins, win, k)


def test_kernel_refuses_non_positive_per(seed):
    """per < 1 (layers a program) is refused by name, as block_c < 1 is."""
    hists, conv_ins = inputs(seed, 2, 2, 3, 4, 8)
    win, keep = jnp.zeros((2, 3), jnp.int32), jnp.ones((2,), bool)
    with pytest.raises(ValueError, match="per must be"):
        pallas_triton.conv_commit(hists, conv_ins, win, keep, interpret=True, per=0)


@pytest.mark.parametrize("h_dtype,x_dtype", [(jnp.float32, jnp.bfloat16), (jnp.bfloat16, jnp.float32)])
def test_mixed_dtypes_pass_through_conv_in_dtype(seed, h_dtype, x_dtype):
    """Histories and conv_ins of different dtypes: history rows pass through conv_in's dtype (as the conv reads
    them), the result has the histories' dtype; reference and kernel alike, equal to numpy."""
    hists, conv_ins = inputs(seed, 3, 3, 3, 5, 32, h_dtype, x_dtype)
    win = jnp.asarray([[0, 1, 2], [1, 2, 3], [2, 4, 7]], jnp.int32)      # history rows, then nodes
    keep = jnp.asarray([True, True, False])
    want = numpy_commit(hists, conv_ins, win, keep, via=x_dtype)
    ref = reference.conv_commit(hists, conv_ins, win, keep)
    ker = pallas_triton.conv_commit(hists, conv_ins, win, keep, interpret=True, block_c=8)
    for got in (ref, ker):
        assert [g.dtype for g in got] == [h.dtype for h in hists]
        for g, w in zip(as_np(got), want):
            np.testing.assert_array_equal(g, w)
    if h_dtype == jnp.float32:      # the rounding through bf16 shows: rows taken from the history changed
        assert not np.array_equal(as_np(ref)[0][0, 0], as_np(hists)[0][0, 0])


def test_indices_past_either_end_are_clipped(seed):
    """Window indices below 0 read the history's first row and those past concat(history, conv_in)'s end read
    the last node, in every channel block of the kernel; reference and kernel equal to numpy."""
    hists, conv_ins = inputs(seed, 2, 3, 3, 4, 64)
    win = jnp.asarray([[-5, 9, 7], [12, -1, 3], [100, 6, -2]], jnp.int32)
    keep = jnp.asarray([True, True, True])
    want = numpy_commit(hists, conv_ins, win, keep)
    ref = reference.conv_commit(hists, conv_ins, win, keep)
    ker = pallas_triton.conv_commit(hists, conv_ins, win, keep, interpret=True, block_c=16)
    for got in (ref, ker):
        for g, w in zip(as_np(got), want):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("n,at_most,want", [(48, 16, 16), (48, 1024, 16), (64, 1024, 64), (24, 8, 8), (12, 3, 2),
                                            (7, 64, 1), (10240, 1024, 1024), (16, 16, 16), (32, 17, 16)])
def test_pow2_divisor(n, at_most, want):
    """The largest power of two <= at_most that divides n, checked against a direct search."""
    got = pallas_triton._pow2_divisor(n, at_most)
    direct = max(d for d in (2 ** k for k in range(20)) if d <= at_most and n % d == 0)
    assert got == direct == want


def test_api_compiled_kernel_is_not_interpreted(seed, monkeypatch):
    """Dispatch to "pallas_triton" calls the kernel with interpret=False, to "pallas_interpret" with True (the
    kernel stubbed by the reference: this test runs on the CPU)."""
    hists, conv_ins = inputs(seed, 2, 2, 3, 4, 8)
    win, keep = jnp.asarray([[1, 2, 3], [0, 4, 6]], jnp.int32), jnp.asarray([True, False])
    calls = []
    monkeypatch.setattr(pallas_triton, "conv_commit",
                        lambda h, x, w, k, **kw: calls.append(kw) or reference.conv_commit(h, x, w, k))
    for impl in ("pallas_triton", "pallas_interpret"):
        got = api.conv_commit(hists, conv_ins, win, keep, implementation=impl)
        for g, w in zip(as_np(got), numpy_commit(hists, conv_ins, win, keep)):
            np.testing.assert_array_equal(g, w)
    assert calls == [dict(interpret=False), dict(interpret=True)]


def test_api_empty_channels_use_the_reference(seed, monkeypatch):
    """Histories with no channels (or no batch) never reach the kernel, whose grid needs both."""
    monkeypatch.setattr(pallas_triton, "conv_commit", lambda *a, **k: pytest.fail("kernel called"))
    for b, c in ((2, 0), (0, 8)):
        hists, conv_ins = inputs(seed, 2, b, 3, 4, c)
        win, keep = jnp.zeros((b, 3), jnp.int32), jnp.ones((b,), bool)
        got = api.conv_commit(hists, conv_ins, win, keep, implementation="pallas_interpret")
        assert [g.shape for g in got] == [(b, 3, c)] * 2


def python_window(parent, last, hist):
    """The conv history after node `last` by definition: the committed history's rows 0..hist-1, then the nodes
    from the root down to `last` (row hist + node), and its last `hist` entries."""
    path, node = [], last
    while node >= 0:
        path.append(node)
        node = parent[node]
    seq = list(range(hist)) + [hist + v for v in reversed(path)]
    return seq[-hist:]


@pytest.mark.parametrize("hist", [1, 2, 3, 5])
def test_window_rows_is_the_path_window(seed, hist):
    """window_rows(tree, last, hist) [B, hist] int32: node last's window of the last `hist` pre-conv inputs, oldest
    first, history rows while the path is shorter than the window; random trees, checked against a walk up the
    parents."""
    rng = np.random.default_rng(seed)
    b, n = 4, 9
    parent = np.stack([[-1] + [int(rng.integers(0, i)) for i in range(1, n)] for _ in range(b)])
    parent[0] = np.arange(n) - 1                                                  # one chain: every depth
    tr = trees.from_parents(jnp.asarray(parent, jnp.int32))
    for _ in range(3):
        last = rng.integers(0, n, b)
        got = window_rows(tr, jnp.asarray(last, jnp.int32), hist)
        assert got.dtype == jnp.int32 and got.shape == (b, hist)
        want = [python_window(parent[i], int(last[i]), hist) for i in range(b)]
        np.testing.assert_array_equal(np.asarray(got), want)


def tiny_model(seed):
    cfg = TargetConfig(vocab_size=97, hidden_size=32, intermediate_size=48, layer_types=(LINEAR, FULL, LINEAR),
                       num_heads=4, num_kv_heads=2, head_dim=16, rotary_dim=8, rope_theta=1e4,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=16, conv_kernel=4, dtype="float32")
    return Qwen35(cfg, rngs=nnx.Rngs(seed))


def test_prefill_commit_n_conv_history_is_the_last_inputs(seed):
    """A chain forward with commit_n: each GDN layer's new conv history is the last K-1 pre-conv inputs of the
    committed sequence (history rows where commit_n < K-1, unchanged where commit_n = 0), checked row by row
    against concat(history, conv_in) from the forward without commit_n (random histories)."""
    m = tiny_model(seed)
    graphdef, params = nnx.split(m)
    rng = np.random.RandomState(seed % 10000)
    b, t = 5, 6
    state = init_state(m.cfg, b, 32)
    state = dataclasses.replace(state, conv=tuple(jnp.asarray(rng.standard_normal(c.shape), c.dtype)
                                                  for c in state.conv))
    tokens = jnp.asarray(rng.randint(0, m.cfg.vocab_size, (b, t)))
    tr = trees.chain(b, t)
    n = jnp.asarray([0, 1, 2, 3, 6], jnp.int32)
    fwd = jax.jit(lambda p, tk, s: nnx.merge(graphdef, p)(tk, s, tr))
    go = jax.jit(lambda p, tk, s, n: nnx.merge(graphdef, p)(tk, s, tr, commit_n=n))
    _, _, _, pend = fwd(params, tokens, state)
    _, _, got, _ = go(params, tokens, state, n)
    km1 = m.cfg.conv_kernel - 1
    assert len(pend.gdn) == len(got.conv) == 2
    for h0, p, h1 in zip(state.conv, pend.gdn, got.conv):
        ext = np.concatenate([np.asarray(h0), np.asarray(p.conv_in)], 1)          # [B, K-1+T, C]
        for i in range(b):
            k = int(n[i])
            want = np.asarray(h0)[i] if k == 0 else ext[i, k:k + km1]
            np.testing.assert_allclose(np.asarray(h1)[i], want, rtol=1e-6, atol=1e-6)


def test_kernel_aliases_each_history_to_its_output():
    """The Triton lowering (an abstract H200; compiling needs the GPU) aliases output l to history l (operand 2 + l,
    after win and keep): the update is written in place."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    hists, conv_ins = inputs(0, 3, 2, 3, 4, 32, jnp.bfloat16, jnp.bfloat16)
    win, keep = jnp.asarray([[1, 2, 3], [3, 4, 5]], jnp.int32), jnp.asarray([True, False])
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda *a: pallas_triton.conv_commit(*a))                  # no donation: the kernel's own aliases
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(hists, conv_ins, win, keep).lower(lowering_platforms=("cuda",)).as_text()
    pairs = re.findall(r"output_tuple_indices = \[(\d+)\], operand_index = (\d+)", hlo)
    assert [(int(o), int(i)) for o, i in pairs] == [(0, 2), (1, 3), (2, 4)]


def test_kernel_body_reads_every_row_before_writing(seed):
    """The kernel's body run with its output refs standing in for the history refs (what the in-place buffers
    are on a GPU; the interpreter otherwise keeps them apart): windows that shift history rows down (depth 0 and 1:
    row r reads row r + 1 or r + 2) and that reverse them still give the reference's result."""
    layers, b, km1, n, c, bc = 2, 4, 3, 4, 32, 16
    hists, conv_ins = inputs(seed, layers, b, km1, n, c)
    win = jnp.asarray([[1, 2, 3], [2, 3, 4], [2, 1, 0], [0, 2, 1]], jnp.int32)
    keep = jnp.asarray([True, True, True, False])
    want = numpy_commit(hists, conv_ins, win, keep)

    def body(win_ref, keep_ref, *refs):
        outs = refs[2 * layers:]
        pallas_triton._kernel(win_ref, keep_ref, *outs, *refs[layers:2 * layers], *outs,
                              layers=layers, per=1, km1=km1, n=n, c=c, bc=bc)

    flat_h = [h.reshape(b, km1 * c) for h in hists]
    flat_x = [x.reshape(b, n * c) for x in conv_ins]
    whole = pl.no_block_spec
    out = pl.pallas_call(body, out_shape=tuple(jax.ShapeDtypeStruct(h.shape, h.dtype) for h in flat_h),
                         grid=(b, c // bc, layers), in_specs=[whole] * (2 + 2 * layers),
                         out_specs=tuple([whole] * layers), input_output_aliases={2 + i: i for i in range(layers)},
                         interpret=True)(win, keep.astype(jnp.int32), *flat_h, *flat_x)
    for o, w in zip(out, want):
        np.testing.assert_array_equal(np.asarray(o).reshape(b, km1, c), w)
