"""Tree attention's kernel against its reference (pallas_kernels/tree_attention).

CPU: the Pallas kernel in interpret mode on fresh random inputs per test (ragged starts, random trees,
N from 1 to 1025, prefixes over several splits, tiles crossing the cache end); the Triton lowering for
an abstract H200 at the real shape. GPU (`-m gpu`, on the H200): the compiled kernel at the real shape
against the reference in fp32 with HIGHEST-precision dots on the same inputs (upcast).

Errors are max |x - ref| / max |ref| over the whole output: bound 1e-4 for fp32 inputs, 1e-2 for bf16.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.tree_attention import api, arg_specs, pallas_triton, reference
from pallas_kernels.tree_attention.arg_specs import Spec, make_inputs
from kernel_tests import on_gpu

BOUND = {"float32": 1e-4, "bfloat16": 1e-2}


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def assert_matches(out, ref, bound):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.isfinite(np.asarray(out, np.float32)).all()
    err = rel_err(out, ref)
    assert err < bound, f"relative error {err:.2e} >= {bound:.0e}"


def interpret(*args, **kw):
    return pallas_triton.tree_attention(*args, interpret=True, **kw)


# ---------------------------------------------------------------------------------------------- CPU
# Small head counts and dims keep the interpreter fast; GQA groups of 1, 3 and 6.

HEADS = [(2, 2, 16), (6, 2, 32), (6, 1, 16)]


@pytest.mark.parametrize("n", [1, 5, 16, 17, 65])
@pytest.mark.parametrize("heads", HEADS, ids=lambda t: "h%d-kv%d-hd%d" % t)
def test_kernel_matches_reference(seed, n, heads):
    h, kv, hd = heads
    args = make_inputs(seed, Spec(3, n, 150, h, kv, hd))
    assert_matches(interpret(*args, block_k=16), reference.tree_attention(*args), BOUND["float32"])


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_kernel_long_prefix_many_splits(seed, shape):
    """A prefix over 5 splits of several tiles each; the other sequence's prefix is shorter."""
    args = make_inputs(seed, Spec(2, 9, 1000, 4, 2, 16, shape=shape))
    assert_matches(interpret(*args, block_k=16, splits=5), reference.tree_attention(*args), BOUND["float32"])


@pytest.mark.parametrize("n", [257, 1025])
def test_kernel_large_trees(seed, n):
    """Trees of up to 1025 nodes: many row blocks and tree tiles (tiny heads and prefix)."""
    args = make_inputs(seed, Spec(1, n, 40, 2, 1, 16, slack=3))
    assert_matches(interpret(*args, block_k=64, splits=2), reference.tree_attention(*args), BOUND["float32"])


@pytest.mark.parametrize("n", [1, 3, 20])
def test_kernel_at_the_cache_end(seed, n):
    """start + N = L: the last tiles would cross the cache end and are shifted back; one sequence with
    no prefix at all (start 0) and one with a prefix that is not a whole number of tiles."""
    spec = Spec(2, n, 45, 4, 2, 16, ragged=False, slack=0)
    q, keys, values, _, anc = make_inputs(seed, spec)
    start = jnp.asarray([45, 0], jnp.int32)
    keys, values = keys.at[1, n:].set(jnp.nan), values.at[1, n:].set(jnp.nan)   # never read past start+N
    args = (q, keys, values, start, anc)
    out = interpret(*args, block_k=16, splits=3)
    ref = reference.tree_attention(q, jnp.nan_to_num(keys), jnp.nan_to_num(values), start, anc)
    assert_matches(out, ref, BOUND["float32"])


def test_tree_columns_bound_each_row_block():
    """A chain of 40 nodes, 3 heads a kv head, 16-row blocks: block r reaches node (16 r + 15) // 3 (the last block
    is partly padding). Reversed, the root is node 39 and every node sees it: no block skips a tile."""
    chain = jnp.asarray(arg_specs.ancestors(np.arange(40)[None] - 1))
    assert pallas_triton.tree_columns(chain, 3, 16).tolist() == [[6, 11, 16, 22, 27, 32, 38, 40]]
    assert pallas_triton.tree_columns(chain[:, ::-1, ::-1], 3, 16).tolist() == [[40] * 8]


@pytest.mark.parametrize("order", ["topological", "reversed"])
def test_kernel_skips_only_unseen_tree_tiles(seed, order):
    """Row blocks read the tree's tiles up to the last node they see; a mask in any node order (reversed: each
    node's ancestors come after it) gives the reference's result."""
    q, keys, values, start, anc = make_inputs(seed, Spec(2, 70, 50, 6, 2, 16))
    if order == "reversed":
        anc = anc[:, ::-1, ::-1]
    args = (q, keys, values, start, anc)
    assert_matches(interpret(*args, block_q=16, block_k=16, splits=2), reference.tree_attention(*args),
                   BOUND["float32"])


def test_kernel_bf16(seed):
    args = make_inputs(seed, Spec(2, 17, 200, 6, 2, 32, dtype="bfloat16"))
    ref = reference.tree_attention(*(x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x for x in args))
    out = interpret(*args, block_k=32)
    assert out.dtype == jnp.bfloat16
    assert_matches(out, ref, BOUND["bfloat16"])


def test_kernel_bf16_products_accumulate_in_fp32():
    """Every dot of the bf16 kernel accumulates in fp32: a bf16 P V product would stay inside the 1e-2 bound (about
    2x the fp32 accumulation's error), so it is checked in the kernel's program, not its output."""
    args = make_inputs(0, Spec(1, 5, 40, 4, 2, 16, dtype="bfloat16"))
    program = str(jax.make_jaxpr(lambda *a: interpret(*a, block_k=16))(*args))
    kinds = set(re.findall(r"preferred_element_type=(\w+)", program))
    assert kinds == {"float32"}, kinds


@pytest.mark.parametrize("n", [1, 17])
def test_kernel_peaked_scores(seed, n):
    """Scores far apart (queries x 40): the splits' partials combine under their common max, never one split's
    (exp of a score over another split's max by more than ~88 overflows fp32)."""
    q, keys, values, start, anc = make_inputs(seed, Spec(3, n, 150, 6, 2, 32))
    args = (40 * q, keys, values, start, anc)
    assert_matches(interpret(*args, block_k=16), reference.tree_attention(*args), BOUND["float32"])


def test_kernel_error_is_detected(seed):
    """The bound can fail: one ancestor edge dropped, or one prefix slot too many, is far outside it."""
    q, keys, values, start, anc = make_inputs(seed, Spec(2, 17, 60, 4, 2, 16, shape="chain"))
    ref = reference.tree_attention(q, keys, values, start, anc)
    assert rel_err(interpret(q, keys, values, start, anc.at[:, 10, 3].set(False), block_k=16), ref) > 1e-2
    assert rel_err(interpret(q, keys, values, start + 1, anc, block_k=16), ref) > 1e-2


def test_reference_is_model_math(seed):
    """The reference is the attention jaxspec/model.py always computed: softmax over the visible slots."""
    q, keys, values, start, anc = make_inputs(seed, Spec(2, 6, 20, 4, 2, 16))
    ref = np.asarray(reference.tree_attention(q, keys, values, start, anc), np.float64)
    q, keys, values = (np.asarray(x, np.float64) for x in (q, keys, values))
    for b in range(2):
        s0 = int(start[b])
        for i in range(6):
            slots = list(range(s0)) + [s0 + j for j in range(6) if anc[b, i, j]]
            for h in range(4):
                sc = keys[b, slots, h // 2] @ q[b, i, h] / 4.0
                p = np.exp(sc - sc.max())
                np.testing.assert_allclose(ref[b, i, h], p @ values[b, slots, h // 2] / p.sum(), rtol=1e-5, atol=1e-6)


def test_dispatch(monkeypatch, seed):
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    assert api.resolve() == "reference"
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert api.resolve() == "pallas_triton"             # the kernel is the default on GPU
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    assert api.resolve() == "pallas_interpret"
    assert api.resolve("reference") == "reference"      # the argument wins over the environment
    monkeypatch.setenv(api.ENV_VAR, "cuda")
    with pytest.raises(ValueError, match=api.ENV_VAR):
        api.resolve()
    with pytest.raises(ValueError, match=api.ENV_VAR):    # refused even where an argument would win over it
        api.resolve("reference")
    monkeypatch.delenv(api.ENV_VAR)
    with pytest.raises(ValueError, match="implementation"):
        api.resolve("triton")
    monkeypatch.undo()
    # shapes the kernel does not take run the reference
    args = make_inputs(seed, Spec(1, 3, 10, 2, 1, 12))
    assert not pallas_triton.supports(args[0].shape, args[1].shape)
    assert_matches(api.tree_attention(*args, implementation="pallas_interpret"),
                   reference.tree_attention(*args), 1e-6)


# Each breaks one part of the contract of Spec(2, 5, 40, 4, 2, 16): q [2, 5, 4, 16], keys and values [2, 82, 2, 16],
# start [2] int32, anc [2, 5, 5]. Before the api checked them, the kernel path returned a result for most.
BAD_SHAPES = {
    "q rank 3": ("q", lambda q, k, v, s, a: (q[0], k, v, s, a)),
    "keys head_dim": ("keys", lambda q, k, v, s, a: (q, k[..., :8], v, s, a)),
    "keys batch": ("keys", lambda q, k, v, s, a: (q, k[:1], v[:1], s, a)),
    "values head_dim": ("values", lambda q, k, v, s, a: (q, k, jnp.concatenate([v, v], -1), s, a)),
    "values shorter": ("values", lambda q, k, v, s, a: (q, k, v[:, :50], s, a)),
    "keys kv heads": ("values", lambda q, k, v, s, a: (q, k[:, :, :1], v, s, a)),   # keys and values differ
    "heads not a multiple": ("query heads", lambda q, k, v, s, a: (q[:, :, :3], k, v, s, a)),
    "start batch": ("start", lambda q, k, v, s, a: (q, k, v, s[:1], a)),
    "start float": ("start", lambda q, k, v, s, a: (q, k, v, s.astype(jnp.float32), a)),
    "anc nodes": ("anc", lambda q, k, v, s, a: (q, k, v, s, a[:, :4, :4])),
    "anc batch": ("anc", lambda q, k, v, s, a: (q, k, v, s, a[:1])),
}


@pytest.mark.parametrize("impl", ["pallas_interpret", "reference"])
@pytest.mark.parametrize("case", sorted(BAD_SHAPES))
def test_api_refuses_shapes_off_the_contract(seed, case, impl):
    """The op checks its shapes on every path (the kernel's, the GPU default, has none of its own), naming the
    argument, its shape and the expected one; also under jit (static shapes)."""
    name, bad = BAD_SHAPES[case]
    args = bad(*make_inputs(seed, Spec(2, 5, 40, 4, 2, 16)))
    with pytest.raises(ValueError, match=f"^tree_attention: .*{name}"):
        api.tree_attention(*args, implementation=impl)
    with pytest.raises(ValueError, match=f"^tree_attention: .*{name}"):
        jax.jit(api.tree_attention, static_argnames="implementation")(*args, implementation=impl)


@pytest.mark.parametrize("impl", ["pallas_interpret", "reference"])
@pytest.mark.parametrize("batch,n", [(0, 3), (2, 0)])
def test_api_empty_batch_or_tree(seed, batch, n, impl):
    """No sequences or no nodes: the reference's empty [B, N, H, hd] in the values' dtype (the kernel's split
    count divided by zero)."""
    q, keys, values, start, anc = make_inputs(seed, Spec(2, 3, 20, 2, 1, 16))
    args = (q[:batch, :n], keys[:batch], values[:batch].astype(jnp.bfloat16), start[:batch], anc[:batch, :n, :n])
    out = api.tree_attention(*args, implementation=impl)
    assert out.shape == (batch, n, 2, 16) and out.dtype == jnp.bfloat16


def test_model_runs_the_dispatched_kernel(seed, monkeypatch):
    """jaxspec/model.py's Attention calls the op: forced to the kernel through the environment, a tree
    verify over a committed prefix gives the reference's output and cache."""
    from flax import nnx

    from jaxspec import tree as tree_lib
    from jaxspec.config import qwen36_27b
    from jaxspec.model import Attention

    cfg = qwen36_27b("float32").replace(hidden_size=32, num_heads=6, num_kv_heads=2, head_dim=16, rotary_dim=4)
    attn = Attention(cfg, rngs=nnx.Rngs(seed))
    q, keys, values, start, anc = make_inputs(seed, Spec(2, 7, 30, 6, 2, 16))
    x = jax.random.normal(jax.random.key(seed), (2, 7, 32))
    tree = tree_lib.Tree(jnp.zeros((2, 7), jnp.int32), jnp.zeros((2, 7), jnp.int32), anc)
    positions = start[:, None] + jnp.asarray(anc.sum(-1) - 1, jnp.int32)
    calls = []
    kernel = pallas_triton.tree_attention
    monkeypatch.setattr(pallas_triton, "tree_attention", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
    outs = {}
    for impl in ("pallas_interpret", "reference"):
        monkeypatch.setenv(api.ENV_VAR, impl)
        outs[impl] = attn(x, keys, values, start, positions, tree)
    assert calls == [(2, 7, 6, 16)]
    for a, b in zip(outs["pallas_interpret"], outs["reference"]):
        assert_matches(a, b, BOUND["float32"])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("n", [1, 65, 1025])
def test_triton_lowering(n, dtype):
    """The compiled path's lowering to Triton IR for an abstract H200 at the real head shape (24 q / 4 kv
    heads of 256): power-of-two tiles, supported primitives. (Compiling it needs the GPU.)"""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    S = jax.ShapeDtypeStruct
    b, length, dt = 2, 40000, jnp.dtype(dtype)
    h, kv, hd = arg_specs.REAL_HEADS, arg_specs.REAL_KV_HEADS, arg_specs.REAL_HEAD_DIM
    shapes = (S((b, n, h, hd), dt), S((b, length, kv, hd), dt), S((b, length, kv, hd), dt), S((b,), jnp.int32),
              S((b, n, n), jnp.bool_))
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = jax.jit(pallas_triton.tree_attention).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1


# ---------------------------------------------------------------------------------------------- GPU

def _gpu_check(seed, spec, **kw):
    args = make_inputs(seed, spec)
    out = jax.jit(lambda *a: pallas_triton.tree_attention(*a, **kw))(*args)
    up = tuple(x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x for x in args)
    ref = jax.jit(reference.tree_attention)(*up)
    assert out.dtype == args[1].dtype
    assert_matches(out, ref, BOUND[spec.dtype])


@on_gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("n", arg_specs.VERIFY_SIZES)
def test_gpu_real_shape_32k(seed, n, dtype):
    """24 q / 4 kv heads of 256 over a 32K prefix (ragged batch of 2), random trees."""
    _gpu_check(seed, Spec(2, n, 32768, dtype=dtype))


@on_gpu
@pytest.mark.parametrize("n,prefix", [(1025, 4096), (257, 1000), (16, 131072), (3, 0)])
def test_gpu_sizes(seed, n, prefix):
    _gpu_check(seed, Spec(1 if prefix > 100000 else 2, n, prefix, dtype="bfloat16", ragged=prefix > 0))


@on_gpu
@pytest.mark.parametrize("block_q,block_k,num_warps", [(16, 64, 4), (32, 32, 4), (16, 128, 8), (64, 64, 4),
                                                     (64, 64, 8), (128, 64, 8)])
def test_gpu_tuning_variants(seed, block_q, block_k, num_warps):
    _gpu_check(seed, Spec(2, 65, 8192, dtype="bfloat16"), block_q=block_q, block_k=block_k, num_warps=num_warps)


def test_default_tiles():
    """At the real head shape: 64 x 32 tiles on 4 warps for bf16 trees (the H200's fastest at N = 65, 128K),
    16-row blocks of 64 keys for one node, fp32 within the shared memory; explicit choices are kept."""
    hd, g = arg_specs.REAL_HEAD_DIM, arg_specs.REAL_HEADS // arg_specs.REAL_KV_HEADS
    assert pallas_triton.tiles(65 * g, hd, 2) == (64, 32, 4)
    assert pallas_triton.tiles(16 * g, hd, 2) == (64, 32, 4)
    assert pallas_triton.tiles(1 * g, hd, 2) == (16, 64, 4)
    assert pallas_triton.tiles(65 * g, hd, 4) == (32, 32, 4)
    assert pallas_triton.tiles(65 * g, 128, 2) == (64, 64, 4)
    assert pallas_triton.tiles(65 * g, hd, 2, block_q=128, block_k=64) == (128, 64, 8)


def test_kernel_default_tiles_at_the_real_head_shape(seed):
    """The bf16 defaults (64 x 32 tiles) in interpret mode: 24 q / 4 kv heads of 256, a 65-node tree."""
    args = make_inputs(seed, Spec(1, 65, 70, arg_specs.REAL_HEADS, arg_specs.REAL_KV_HEADS, arg_specs.REAL_HEAD_DIM,
                                  dtype="bfloat16"))
    ref = reference.tree_attention(*(x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x for x in args))
    assert_matches(interpret(*args), ref, BOUND["bfloat16"])


@pytest.mark.parametrize("dtype,block_q,block_k", [("bfloat16", 64, 64), ("float32", 32, 32)])
def test_default_tiles_fit_shared_memory(dtype, block_q, block_k):
    """The H200 refused fp32 at hd 256 with 64-key tiles (237,824 > 232,448 bytes) and bf16 (64, 128)
    (294,912): the defaults now pick tiles that fit, and an explicit tile that cannot fit is refused by name."""
    itemsize = jnp.dtype(dtype).itemsize
    assert pallas_triton.smem_bytes(block_q, block_k, 256, itemsize, 2) <= pallas_triton.SMEM_LIMIT
    assert pallas_triton.smem_bytes(block_q, 2 * block_k, 256, itemsize, 2) > pallas_triton.SMEM_LIMIT
    args = make_inputs(3, Spec(1, 5, 40, heads=4, kv_heads=2, head_dim=256, dtype=dtype))
    with pytest.raises(ValueError, match="shared memory"):
        jax.eval_shape(lambda *a: pallas_triton.tree_attention(*a, block_q=64, block_k=128), *args)


@on_gpu
def test_gpu_cache_end(seed):
    """start + N = L with N = 1: the last tile is shifted back to end at the cache end."""
    _gpu_check(seed, Spec(2, 1, 5000, dtype="bfloat16", slack=0))


@on_gpu
def test_gpu_opt_in_dispatch_is_the_kernel(seed, monkeypatch):
    monkeypatch.setenv(api.ENV_VAR, "pallas_triton")
    args = make_inputs(seed, Spec(1, 16, 4096, dtype="bfloat16"))
    fn = jax.jit(api.tree_attention)
    assert fn.lower(*args).as_text().count("__gpu$xla.gpu.triton") == 1
    up = tuple(x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x for x in args)
    assert_matches(fn(*args), jax.jit(reference.tree_attention)(*up), BOUND["bfloat16"])


def test_bench_reports_bytes_and_flops(tmp_path):
    """The benchmark at the real head shape (on the CPU: the reference): KV bytes and the two products' FLOPs
    over every key read, each over the device time per layer (the synchronised time reported beside it)."""
    import json

    from pallas_kernels.tree_attention import bench
    bench.main(["--prefixes", "64", "--sizes", "5", "--layers", "1", "--iters", "1", "--json", str(tmp_path / "a.json")])
    (row,) = json.loads((tmp_path / "a.json").read_text())["rows"]
    h, kv, hd = arg_specs.REAL_HEADS, arg_specs.REAL_KV_HEADS, arg_specs.REAL_HEAD_DIM
    assert row["impl"] == "reference" and row["kv_bytes"] == 2 * (64 + 5) * kv * hd * 2
    assert row["flops"] == 4 * 5 * h * (64 + 5) * hd
    assert row["device_us_per_layer"] > 0 and row["us_per_layer"] > 0
    assert row["flop_s"] == pytest.approx(row["flops"] / (row["device_us_per_layer"] * 1e-6))
    assert row["bytes_per_s"] == pytest.approx(row["kv_bytes"] / (row["device_us_per_layer"] * 1e-6))


def test_bench_split_variants():
    """`--splits 4,8`: the kernel with those prefix splits beside the default, at every size, on a GPU only."""
    from pallas_kernels.tree_attention import bench
    impls = bench.implementations(False, True, 16, [4, 8])
    assert list(impls) == ["reference", "pallas_triton", "pallas_triton/s4", "pallas_triton/s8"]
    assert impls["pallas_triton/s8"].keywords == {"splits": 8}
    assert list(bench.implementations(False, False, 16, [4])) == ["reference"]


def test_bench_sweeps_tiles_from_65_nodes_and_times_chains(tmp_path):
    """`--sweep` adds the tile and warp variants that fit at N >= 65 (a verify tree, a prefill piece), not below;
    `--shape chain` times a chain (on the CPU: the reference, whose output must match the kernel's contract)."""
    import json

    from pallas_kernels.tree_attention import bench
    for n in (65, 8192):
        tiles = [k for k in bench.implementations(True, True, n) if k.count("/") == 3]
        assert "pallas_triton/q128/k64/w8" in tiles and "pallas_triton/q128/k128/w8" not in tiles, n
    assert list(bench.implementations(True, True, 64)) == ["reference", "pallas_triton"]
    bench.main(["--prefixes", "0", "--sizes", "20", "--shape", "chain", "--layers", "1", "--iters", "1",
                "--json", str(tmp_path / "c.json")])
    data = json.loads((tmp_path / "c.json").read_text())
    (row,) = data["rows"]
    assert data["shape"] == "chain"
    assert row["impl"] == "reference" and row["finite"] and row["kv_bytes"] == 2 * 20 * 4 * 256 * 2
