"""Chain attention (pallas_kernels/chain_attention) against its spec, tree attention with a causal mask.

CPU: the split the GPU path makes (the prefix by the tree attention kernel's prefix programs, interpreted; the
block's own keys in jnp), merged, on fresh random inputs: first pieces (start 0, which skip the prefix), ragged
starts, blocks that cross prefix splits. GPU (`-m gpu`): the prefix kernel compiled and cuDNN's causal attention at
the real heads (24 q / 4 kv of 256, bf16), up to an 8K block, against the reference in fp32.

Errors are max |x - ref| / max |ref|: bound 1e-4 for fp32 inputs, 1e-2 for bf16 (as in
tests/test_tree_attention_kernel.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import dispatch
from pallas_kernels.chain_attention import api, chain_attention, reference
from pallas_kernels.tree_attention import reference as tree_reference
from pallas_kernels.tree_attention.arg_specs import Spec, make_inputs
from kernel_tests import on_gpu

BOUND = {"float32": 1e-4, "bfloat16": 1e-2}


def inputs(seed, spec, starts=None):
    """(q, k, v, keys, values, start) for a chain block: the block's own k, v are what the cache holds at its
    slots (start given per row, or make_inputs' ragged starts)."""
    q, keys, values, start, _ = make_inputs(seed, spec)
    if starts is not None:
        start = jnp.asarray(starts, jnp.int32)
    slots = start[:, None] + jnp.arange(spec.n)
    rows = jnp.arange(spec.batch)[:, None]
    return q, keys[rows, slots], values[rows, slots], keys, values, start


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def check(seed, spec, starts=None, implementation="pallas_interpret"):
    args = inputs(seed, spec, starts)
    out = chain_attention(*args, implementation=implementation)
    up = lambda x: x.astype(jnp.float32) if x.dtype != jnp.int32 else x
    want = reference.chain_attention(*map(up, args))
    assert out.shape == want.shape and out.dtype == args[4].dtype
    assert np.isfinite(np.asarray(out, np.float32)).all()
    err = rel_err(out, want)
    assert err < BOUND[spec.dtype], f"relative error {err:.2e}"
    return err


# ---------------------------------------------------------------------------------------------- CPU

@pytest.mark.parametrize("starts", [[0, 0], [0, 37], [150, 23], [90, 150]], ids=str)
@pytest.mark.parametrize("heads", [(2, 2, 16), (6, 2, 32)], ids=lambda t: "h%d-kv%d-hd%d" % t)
def test_split_matches_reference(seed, starts, heads):
    h, kv, hd = heads
    check(seed, Spec(2, 40, 150, h, kv, hd, shape="chain"), starts)


@pytest.mark.parametrize("n", [1, 17, 64])
def test_split_block_sizes(seed, n):
    check(seed, Spec(3, n, 200, 4, 2, 16, shape="chain"))


@pytest.mark.parametrize("starts", [[150, 23], [0, 150]], ids=str)
def test_split_peaked_scores(seed, starts):
    """Scores far apart (queries x 40): the prefix's partials and the block's own attention merge under their common
    max (exp of a score over one part's max by more than ~88 overflows fp32)."""
    q, k, v, keys, values, start = inputs(seed, Spec(2, 9, 150, 6, 2, 32, shape="chain"), starts)
    args = (40 * q, k, v, keys, values, start)
    out = chain_attention(*args, implementation="pallas_interpret")
    assert np.isfinite(np.asarray(out)).all()
    for want in (reference.chain_attention(*args), numpy_chain_attention(args[0], *args[3:])):
        assert rel_err(out, want) < BOUND["float32"]


def test_split_bf16(seed):
    check(seed, Spec(2, 33, 120, 6, 2, 32, shape="chain", dtype="bfloat16"), [0, 120])


@pytest.mark.parametrize("tiles", [dict(block_q=32, block_k=16, splits=3), dict(block_q=16, block_k=32, splits=1)],
                         ids=str)
def test_prefix_partials_tiles_and_splits(seed, tiles):
    """The prefix partials under other tiles and split counts merge to the same attention as the defaults'."""
    from pallas_kernels.tree_attention import pallas_triton
    q, k, v, keys, values, start = inputs(seed, Spec(2, 24, 130, 6, 2, 16, shape="chain"), [130, 57])
    o, lse = reference.self_attention(q, k, v)
    want = reference.merge(*pallas_triton.prefix_partials(q, keys, values, start, interpret=True), o, lse)
    got = reference.merge(*pallas_triton.prefix_partials(q, keys, values, start, interpret=True, **tiles), o, lse)
    assert rel_err(got, want) < BOUND["float32"]
    assert rel_err(got, reference.chain_attention(q, k, v, keys, values, start)) < BOUND["float32"]


def test_first_piece_is_the_blocks_own_attention(seed):
    """With every start 0 the result is the block's causal attention alone, and the reference's."""
    q, k, v, keys, values, start = inputs(seed, Spec(2, 24, 0, 4, 2, 16, shape="chain", ragged=False))
    o, lse = reference.self_attention(q, k, v)
    assert np.array_equal(chain_attention(q, k, v, keys, values, start, implementation="pallas_interpret"), o)
    scores = jnp.einsum("bnkgh,bmkh->bkgnm", q.reshape(2, 24, 2, 2, 16), k) / 4.0
    scores = jnp.where(jnp.tril(jnp.ones((24, 24), bool)), scores, -jnp.inf)
    want = jnp.moveaxis(jax.nn.logsumexp(scores, -1), -1, 1).reshape(2, 24, 4)
    np.testing.assert_allclose(lse, want, rtol=1e-5, atol=1e-5)
    assert rel_err(o, reference.chain_attention(q, k, v, keys, values, start)) < BOUND["float32"]


def test_merge_of_any_split_is_the_whole(seed):
    """Keys cut into a prefix of three parts and the block: merging their partials gives softmax over all."""
    rng = np.random.default_rng(seed)
    s = jnp.asarray(rng.standard_normal((1, 5, 2, 30)) * 3, jnp.float32)         # [B, N, H, keys]
    vals = jnp.asarray(rng.standard_normal((1, 5, 2, 30, 8)), jnp.float32)
    parts = [(0, 7), (7, 12), (12, 21)]
    m = jnp.stack([s[..., a:b].max(-1) for a, b in parts], -1)
    l = jnp.stack([jnp.exp(s[..., a:b] - s[..., a:b].max(-1, keepdims=True)).sum(-1) for a, b in parts], -1)
    acc = jnp.stack([jnp.einsum("bnhk,bnhkd->bnhd", jnp.exp(s[..., a:b] - s[..., a:b].max(-1, keepdims=True)),
                                vals[..., a:b, :]) for a, b in parts], -2)
    lse = jax.nn.logsumexp(s[..., 21:], -1)
    o = jnp.einsum("bnhk,bnhkd->bnhd", jax.nn.softmax(s[..., 21:], -1), vals[..., 21:, :])
    want = jnp.einsum("bnhk,bnhkd->bnhd", jax.nn.softmax(s, -1), vals)
    np.testing.assert_allclose(reference.merge(m, l, acc, o, lse), want, rtol=1e-5, atol=1e-6)
    # A split that saw nothing (m = -inf, l = 0) counts for nothing.
    empty = lambda x, fill: jnp.concatenate([x, jnp.full(x.shape[:3] + (1,) + x.shape[4:], fill, x.dtype)], 3)
    np.testing.assert_allclose(reference.merge(empty(m, -jnp.inf), empty(l, 0.0), empty(acc, 0.0), o, lse), want,
                               rtol=1e-5, atol=1e-6)


def numpy_chain_attention(q, keys, values, start):
    """The spec written out in float64 numpy, independent of either reference: node i of row b sees cache slots
    0 .. start[b] + i (the prefix and the block's nodes 0 .. i), query head h reads kv head h // (H / KV)."""
    q, keys, values = (np.asarray(x, np.float64) for x in (q, keys, values))
    b, n, h, hd = q.shape
    group = h // keys.shape[2]
    out = np.zeros_like(q)
    for r in range(b):
        for i in range(n):
            seen = int(start[r]) + i + 1
            for j in range(h):
                s = keys[r, :seen, j // group] @ q[r, i, j] / np.sqrt(hd)
                p = np.exp(s - s.max())
                out[r, i, j] = p @ values[r, :seen, j // group] / p.sum()
    return out


def test_reference_is_the_spec(seed):
    """reference.chain_attention (tree attention's reference with a causal mask) against the float64 spec, with
    ragged starts and a first piece."""
    q, k, v, keys, values, start = inputs(seed, Spec(3, 20, 60, 4, 2, 16, shape="chain"), [0, 60, 23])
    got = chain_attention(q, k, v, keys, values, start, implementation="reference")
    assert rel_err(got, numpy_chain_attention(q, keys, values, start)) < 1e-5


def test_tree_implementation_runs_the_tree_kernel(seed, monkeypatch):
    """implementation="tree" goes through the tree attention op: with its kernel forced (interpreted), the kernel is
    traced and its result is the spec's."""
    from pallas_kernels.tree_attention import pallas_triton
    traced = []
    kernel = pallas_triton.tree_attention
    monkeypatch.setattr(pallas_triton, "tree_attention", lambda *a, **kw: traced.append(1) or kernel(*a, **kw))
    monkeypatch.setenv("JAXSPEC_TREE_ATTENTION", "pallas_interpret")
    args = inputs(seed, Spec(2, 20, 60, 4, 2, 16, shape="chain"), [60, 7])
    got = chain_attention(*args, implementation="tree")
    assert traced, "the tree kernel did not run"
    assert rel_err(got, numpy_chain_attention(args[0], *args[3:])) < BOUND["float32"]


def test_dispatch(monkeypatch):
    """The tree op off the GPU and for short chains or fp32 caches on it; cuDNN's split for chains of MIN_NODES
    and more over a 16-bit cache on a GPU (whatever q's dtype: it runs in the cache's); the flag forces, an explicit
    choice wins, a differentiable trace gets the tree op."""
    S = jax.ShapeDtypeStruct
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    q = lambda n, dt=jnp.bfloat16: (S((1, n, 24, 256), jnp.float32), S((1, 9000, 4, 256), dt))  # (q, keys)
    assert api.resolve(*q(8192)) == "tree"                               # this test runs on the CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert api.resolve(*q(api.MIN_NODES)) == "pallas_cudnn"
    assert api.resolve(*q(api.MIN_NODES - 1)) == "tree"
    assert api.resolve(*q(8192, jnp.float32)) == "tree"
    with dispatch.differentiable():
        assert api.resolve(*q(8192)) == "tree"
    monkeypatch.setenv(api.ENV_VAR, "reference")
    assert api.resolve(*q(8192)) == "reference" and api.resolve(*q(8192), "tree") == "tree"
    monkeypatch.setenv(api.ENV_VAR, "cudnn")
    with pytest.raises(ValueError, match=api.ENV_VAR):
        api.resolve(*q(8192))


def test_bad_block_keys_are_refused(seed):
    q, k, v, keys, values, start = inputs(seed, Spec(1, 8, 20, 4, 2, 16, shape="chain"))
    with pytest.raises(ValueError, match=r"k \(1, 7, 2, 16\)"):
        chain_attention(q, k[:, :7], v, keys, values, start)


def test_model_runs_the_chain_op(seed, monkeypatch):
    """jaxspec/model.py's Attention sends a chain to the op: forced to the split through the environment, a prefill
    piece over a committed prefix gives the tree reference's output and cache; a tree never reaches it."""
    from flax import nnx

    from jaxspec import tree as tree_lib
    from jaxspec.config import qwen36_27b
    from jaxspec.model import Attention
    from pallas_kernels.tree_attention import api as tree_api

    cfg = qwen36_27b("float32").replace(hidden_size=32, num_heads=6, num_kv_heads=2, head_dim=16, rotary_dim=4)
    attn = Attention(cfg, rngs=nnx.Rngs(seed))
    _, keys, values, _, _ = make_inputs(seed, Spec(2, 9, 30, 6, 2, 16))
    start = jnp.asarray([30, 11], jnp.int32)
    x = jax.random.normal(jax.random.key(seed), (2, 9, 32))
    positions = start[:, None] + jnp.arange(9, dtype=jnp.int32)
    calls = []
    split = api.chain_attention
    monkeypatch.setattr(api, "chain_attention", lambda *a, **kw: calls.append(a[0].shape) or split(*a, **kw))
    import jaxspec.model as model_lib
    monkeypatch.setattr(model_lib, "chain_attention", api.chain_attention)
    outs = {}
    for impl in ("pallas_interpret", "tree"):
        monkeypatch.setenv(api.ENV_VAR, impl)
        monkeypatch.setenv(tree_api.ENV_VAR, "reference")
        outs[impl] = attn(x, keys, values, start, positions, tree_lib.chain(2, 9))
    assert calls == [(2, 9, 6, 16)]
    for a, b in zip(outs["pallas_interpret"], outs["tree"]):
        assert rel_err(a, b) < BOUND["float32"]


# ---------------------------------------------------------------------------------------------- GPU

@on_gpu
@pytest.mark.parametrize("n,starts", [(8192, [0]), (256, [1000]), (200, [0, 300]), (128, [5000, 77])], ids=str)
def test_gpu_real_shape(seed, n, starts):
    """The prefix kernel compiled and cuDNN's causal attention, bf16 at the real heads, against fp32; the default
    dispatch picks them."""
    spec = Spec(len(starts), n, max(starts), shape="chain", dtype="bfloat16")
    q, _, _, keys, _, _ = inputs(seed, spec, starts)
    assert api.resolve(q, keys) == "pallas_cudnn"
    check(seed, spec, starts, implementation="pallas_cudnn")
