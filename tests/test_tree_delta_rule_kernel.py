"""The tree delta rule's implementations against its reference (pallas_kernels/tree_delta_rule).

CPU: the Pallas kernels in interpret mode and the xla solver, on fresh random inputs per test; the
Triton lowering for an abstract H200 (catches what only the GPU lowering rejects, on the CPU).
GPU (`-m gpu`, on the H200): the compiled kernels at the real shape.

Errors are max |x - ref| / max |ref| over the whole output, in fp32: bound 1e-4 (issue 6, fp32 inputs).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.tree_delta_rule import api, arg_specs, pallas_triton, reference, xla
from pallas_kernels.tree_delta_rule.arg_specs import Spec, make_inputs
from kernel_tests import on_gpu

BOUND = 1e-4


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def assert_matches(out, ref, bound=BOUND):
    """o, delta and G each within `bound` of the reference, and finite."""
    for name, x, r in zip(("o", "delta", "G"), out, ref):
        assert x.shape == r.shape, (name, x.shape, r.shape)
        assert np.isfinite(np.asarray(x)).all(), name
        err = rel_err(x, r)
        assert err < bound, f"{name}: relative error {err:.2e} >= {bound:.0e}"


def interpret(*args, **kw):
    return pallas_triton.tree_delta_rule(*args, interpret=True, **kw)


# ---------------------------------------------------------------------------------------------- CPU

SIZES = (1, 5, 16, 17, 64, 65)
# (value heads, key heads, Dk, Dv): padded to 16/32 inside; 6 over 2: each key head serves 3 value heads
HEADS = [(1, 1, 8, 8), (3, 3, 16, 24), (2, 2, 32, 32), (6, 2, 16, 16)]


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("heads", HEADS, ids=lambda t: "h%d-hk%d-dk%d-dv%d" % t)
def test_kernel_matches_reference(seed, n, shape, heads):
    h, hk, dk, dv = heads
    args, _ = make_inputs(seed, Spec(2, n, h, dk, dv, shape, key_heads=hk))
    assert_matches(interpret(*args), reference.tree_delta_rule(*args))


@pytest.mark.parametrize("n,gram_inside", [(16, False), (40, True)])
def test_kernel_gram_either_side(seed, n, gram_inside):
    """The Gram tiles inside `_prepare` (the default for one tile) and ahead of it (the default for more)
    give the same answer at any size, grouped heads included."""
    args, _ = make_inputs(seed, Spec(2, n, 4, 16, 16, "tree", key_heads=2))
    assert_matches(interpret(*args, gram_inside=gram_inside), reference.tree_delta_rule(*args))


@pytest.mark.parametrize("option", ["precision", "gram_precision"])
def test_kernel_refuses_unknown_precision(seed, option):
    args, _ = make_inputs(seed, Spec(1, 20, 2, 16, 16, "tree"))
    with pytest.raises(ValueError, match=f"{option}='bf16'; expected one of ieee, tf32x3"):
        interpret(*args, **{option: "bf16"})


def test_grouped_heads_equal_repeated_heads(seed):
    """Key heads serving several value heads are the same rule as the keys repeated per value head
    (value head h reads key head h // rep), in every implementation; shapes that do not group are refused."""
    args, parent = make_inputs(seed, Spec(2, 17, 6, 16, 16, "tree", key_heads=2))
    q, k = args[:2]
    repeated = (jnp.repeat(q, 3, 2), jnp.repeat(k, 3, 2)) + args[2:]
    ref = reference.tree_delta_rule(*repeated)
    o64, d64, _ = arg_specs.recurrence64(args, parent)
    assert rel_err(ref[0], o64) < BOUND and rel_err(ref[1], d64) < BOUND
    for fn in (reference.tree_delta_rule, xla.tree_delta_rule, interpret):
        assert_matches(fn(*args), ref)
    with pytest.raises(ValueError, match="dividing the value heads"):
        reference.tree_delta_rule(q[:, :, :1].repeat(4, 2), k[:, :, :1].repeat(4, 2), *args[2:])


# Arguments that break the contract, each against q, k [B, N, Hk, Dk] and v [B, N, H, Dv] (here B = 2, N = 5, H = 4,
# Hk = 2, Dk = Dv = 16): (argument, its index, the wrong value). The kernels computed NaN or garbage from most of
# them, the jnp solvers failed deep in an einsum.
BAD_ARGS = [("g", 3, lambda x: x[..., :2]), ("beta", 4, lambda x: x[:, :4]), ("anc", 5, lambda x: x[:, :4, :4]),
            ("anc", 5, lambda x: x.astype(jnp.float32)), ("s0", 6, lambda x: x[:, :2]),
            ("s0", 6, lambda x: x[:, :, :8]), ("s0", 6, lambda x: x[..., :8]), ("s0", 6, lambda x: x[:1])]


@pytest.mark.parametrize("name,index,bad", BAD_ARGS, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(BAD_ARGS)])
def test_bad_shapes_are_refused(seed, name, index, bad):
    """Every implementation refuses an argument that does not fit q and v, naming it, its shape and the one
    expected."""
    args, _ = make_inputs(seed, Spec(2, 5, 4, 16, 16, "tree", key_heads=2))
    args = list(args)
    args[index] = bad(args[index])
    shape = re.escape(str(args[index].shape))
    for impl in ("reference", "xla", "pallas_interpret"):
        with pytest.raises(ValueError, match=rf"tree_delta_rule: {name} {shape}.* must be"):
            api.tree_delta_rule(*args, implementation=impl)


@pytest.mark.parametrize("empty", ["batch", "nodes"])
def test_empty_blocks(seed, empty):
    """No sequence or no node: every implementation returns the reference's empty outputs (the kernels' grids and
    index maps failed on them, or refused N = 0)."""
    args, _ = make_inputs(seed, Spec(2, 5, 4, 16, 16, "tree", key_heads=2))
    q, k, v, g, beta, anc, s0 = args
    if empty == "batch":
        args = [x[:0] for x in args]
    else:
        args = [x[:, :0] for x in (q, k, v, g, beta)] + [anc[:, :0, :0], s0]
    ref = reference.tree_delta_rule(*args)
    assert ref[0].shape == ((0, 5, 4, 16) if empty == "batch" else (2, 0, 4, 16))
    for impl in ("xla", "pallas_interpret", "pallas_triton"):
        out = api.tree_delta_rule(*args, implementation=impl)
        assert [(x.shape, x.dtype) for x in out] == [(x.shape, x.dtype) for x in ref], impl


@pytest.mark.parametrize("n", [17, 65])
def test_kernel_ragged(seed, n):
    """Per sequence a different number of real nodes, the rest inert padding (zero inputs)."""
    args, _ = make_inputs(seed, Spec(3, n, 2, 16, 16, "ragged"))
    assert_matches(interpret(*args), reference.tree_delta_rule(*args))


@pytest.mark.parametrize("block_dv,key_chunk", [(64, 32), (32, 16), (128, 128)])
def test_kernel_real_head_dims(seed, block_dv, key_chunk):
    """Dk = Dv = 128: several value slices per head and several key chunks per dot."""
    args, _ = make_inputs(seed, Spec(2, 65, 2, 128, 128, "tree"))
    out = interpret(*args, block_dv=block_dv, key_chunk=key_chunk)
    assert_matches(out, reference.tree_delta_rule(*args))


def test_kernel_correlated_keys(seed):
    """Nearly parallel keys, weak decay, strong writes: the system is far from the identity."""
    args, _ = make_inputs(seed, Spec(2, 64, 2, 32, 32, "chain", correlated=True))
    assert_matches(interpret(*args), reference.tree_delta_rule(*args))


def test_kernel_strong_decay(seed):
    """G reaches -1300 on a chain of 65: exp(-G_j) overflows fp32, exp(G_i - G_j) must not be
    formed from it."""
    args, _ = make_inputs(seed, Spec(2, 65, 2, 16, 16, "chain", log_decay=-20.0))
    out = interpret(*args)
    ref = reference.tree_delta_rule(*args)
    assert np.asarray(ref[2]).min() < -1000
    assert_matches(out, ref)


def test_kernel_error_is_detected(seed):
    """The bound can fail: the same inputs with one ancestor edge dropped are far outside it."""
    args, _ = make_inputs(seed, Spec(2, 17, 2, 16, 16, "chain"))
    anc = np.array(args[5])
    anc[:, 10, 3] = False                       # node 10 forgets ancestor 3
    out = interpret(*args[:5], jnp.asarray(anc), args[6])
    ref = reference.tree_delta_rule(*args)
    assert rel_err(out[0], ref[0]) > 100 * BOUND


def test_kernel_state_rebuild(seed):
    """Delta and G from the kernel rebuild every node's state (as commit does), equal to the float64
    recurrence along its path."""
    args, parent = make_inputs(seed, Spec(2, 20, 2, 16, 16, "tree"))
    q, k, v, g, beta, anc, s0 = args
    o, delta, G = interpret(*args)
    o64, d64, s64 = arg_specs.recurrence64(args, parent)
    assert rel_err(o, o64) < BOUND and rel_err(delta, d64) < BOUND
    for i in (0, 7, 19):
        assert rel_err(reference.state_at(s0, k, delta, G, anc[:, i], G[:, i]), s64[:, i]) < BOUND


def test_kernel_too_large():
    args, _ = make_inputs(0, Spec(1, pallas_triton.MAX_N + 1, 1, 16, 16, "chain"))
    with pytest.raises(ValueError, match="nodes"):
        interpret(*args)


@pytest.mark.parametrize("shape", ["chain", "tree", "ragged"])
@pytest.mark.parametrize("n", (1, 2, 5, 16, 17, 64, 65, 130))
def test_xla_matches_reference(seed, n, shape):
    args, _ = make_inputs(seed, Spec(2, n, 3, 16, 24, shape))
    assert_matches(jax.jit(xla.tree_delta_rule)(*args), reference.tree_delta_rule(*args))


@pytest.mark.parametrize("n", (1, 2, 3, 7, 16, 33))
def test_unit_lower_inverse(seed, n):
    # Entries of the model's size (|beta D k.k| < 1, mostly much less); unit lower-triangular matrices
    # with N(0, 1) entries have inverses growing like 2^n, which says nothing about the algorithm.
    rng = np.random.default_rng(seed)
    L = np.tril(rng.standard_normal((2, n, n)) / np.sqrt(n), -1).astype(np.float32)
    inv = xla.unit_lower_inverse(jnp.asarray(L))
    assert rel_err(inv, np.linalg.inv(np.eye(n) + L.astype(np.float64))) < 1e-5


@pytest.mark.parametrize("used", (1, 2, 5, 9, 16))
def test_kernel_tile_inverse(seed, used):
    """The kernel's [16, 16] tile inverse (recursive doubling, as jnp outside a kernel) against float64, with the
    rows from `used` on zero, as the padding nodes of a ragged last tile are: their rows stay e_r."""
    rng = np.random.default_rng(seed)
    a = np.tril(rng.standard_normal((16, 16)) / 4, -1)
    a[used:] = 0.0
    inv = pallas_triton._unit_lower_inverse(jnp.asarray(a, jnp.float32), jax.lax.Precision.HIGHEST)
    want = np.linalg.inv(np.eye(16) + a)
    assert rel_err(inv, want) < 1e-6
    np.testing.assert_array_equal(np.asarray(inv)[used:], np.eye(16)[used:])


def test_xla_is_as_accurate_as_reference(seed):
    """Why "xla" is the CPU default: against the float64 recurrence its norm-wise error is on average
    no larger than the reference's (solve_triangular), on random and on correlated keys. (Measured
    over 125 cases: 0.99x. The product form of the inverse fails this by orders of magnitude.)"""
    norm_err = lambda x, r: np.linalg.norm(np.asarray(x, np.float64) - r) / np.linalg.norm(r)
    ratios = []
    for i, (n, shape, correlated) in enumerate([(16, "chain", False), (65, "tree", False),
                                                 (64, "chain", True), (65, "tree", True)]):
        for s in range(4):
            args, parent = make_inputs(seed + 10 * i + s, Spec(1, n, 4, 64, 64, shape, correlated))
            o64, d64, _ = arg_specs.recurrence64(args, parent)
            err = lambda out: max(norm_err(out[0], o64), norm_err(out[1], d64))
            ratios.append(err(jax.jit(xla.tree_delta_rule)(*args)) / err(reference.tree_delta_rule(*args)))
    assert np.exp(np.mean(np.log(ratios))) < 1.03, ratios
    assert max(ratios) < 1.2, ratios


def test_dispatch(monkeypatch):
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    assert api.resolve(65) == "xla"                       # this test runs on the CPU
    assert api.resolve(65, "reference") == "reference"
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    assert api.resolve(65) == "pallas_interpret"
    assert api.resolve(65, "xla") == "xla"                # the argument wins over the environment
    monkeypatch.setenv(api.ENV_VAR, "cuda")
    with pytest.raises(ValueError, match=api.ENV_VAR):
        api.resolve(65)
    with pytest.raises(ValueError, match=api.ENV_VAR):    # refused even where an argument would win over it
        api.resolve(65, "xla")
    monkeypatch.delenv(api.ENV_VAR)
    with pytest.raises(ValueError, match="implementation"):
        api.resolve(65, "triton")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    # On the GPU: the kernels for 2..128 nodes, the xla solver for the one-node step and larger trees.
    assert api.resolve(16) == api.resolve(65) == api.resolve(128) == "pallas_triton"
    assert api.resolve(1) == api.resolve(129) == api.resolve(1025) == "xla"
    monkeypatch.setenv(api.ENV_VAR, "pallas_triton")
    assert api.resolve(65) == "pallas_triton"


def test_model_runs_the_dispatched_kernel(seed, monkeypatch):
    """jaxspec/model.py calls tree_delta_rule unchanged: forced to the kernel through the environment,
    the chunked chain (3 chunks of 64, the state carried by lax.scan) and a tree agree with the
    reference."""
    from jaxspec import tree as tree_lib
    from jaxspec.model import delta_rule

    calls = []
    kernel = pallas_triton.tree_delta_rule
    monkeypatch.setattr(pallas_triton, "tree_delta_rule", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
    for n, tree in [(130, tree_lib.chain(2, 130)), (20, None)]:
        args, parent = make_inputs(seed + n, Spec(2, n, 2, 16, 16, "chain" if tree is not None else "tree"))
        tree = tree or tree_lib.from_parents(jnp.asarray(parent))
        q, k, v, g, beta, anc, s0 = args
        monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
        out = jax.jit(lambda *a: delta_rule(*a, tree, s0))(q, k, v, g, beta)
        monkeypatch.setenv(api.ENV_VAR, "reference")
        ref = jax.jit(lambda *a: delta_rule(*a, tree, s0))(q, k, v, g, beta)
        assert_matches(out[:3], ref[:3])
        if ref[3].size:                                  # states entering chunks 2.. (chains only)
            assert rel_err(out[3], ref[3]) < BOUND
    assert calls == [(2, 64, 2, 16), (2, 20, 2, 16)]


@pytest.mark.parametrize("n", [1, 16, 65])
@pytest.mark.parametrize("precision", [None] + sorted(pallas_triton.PRECISIONS))
def test_triton_lowering(n, precision):
    """The compiled path's lowering to Triton IR, for an abstract H200, at the real head dims: power-of-
    two shapes, supported primitives, prepare + apply, the dot precision (the kernels' and the Gram product's;
    None: the defaults, fp32 FMA dots in the kernels and three tf32 passes for the Gram product); one tile (Gram
    tiles inside) and five.
    (Compiling it needs the GPU.)"""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    f32 = jnp.float32
    b, h, hk, dk, dv = 1, arg_specs.REAL_HEADS, arg_specs.REAL_KEY_HEADS, arg_specs.REAL_DK, arg_specs.REAL_DV
    S = jax.ShapeDtypeStruct
    shapes = (S((b, n, hk, dk), f32), S((b, n, hk, dk), f32), S((b, n, h, dv), f32), S((b, n, h), f32),
              S((b, n, h), f32), S((b, n, n), jnp.bool_), S((b, h, dk, dv), f32))
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    options = {} if precision is None else dict(precision=precision, gram_precision=precision)
    fn = jax.jit(lambda *a: pallas_triton.tree_delta_rule(*a, **options))
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 2
    # Beyond one tile, one product ahead of the kernels forms Q K^T and K K^T, at the precision asked for.
    assert hlo.count("stablehlo.dot_general") == (n > pallas_triton.TILE)
    if n > pallas_triton.TILE:
        dot = next(line for line in hlo.splitlines() if "stablehlo.dot_general" in line)
        assert ("[HIGHEST, HIGHEST]" if precision == "ieee" else "num_primitive_operations = 3") in dot
    assert "triangular_solve" not in hlo


def test_bench_runs_and_writes_json(tmp_path):
    """The benchmark at the real head shape (on the CPU: reference and xla, 2 layers, 1 timed call)."""
    import json

    from pallas_kernels.tree_delta_rule import bench
    bench.main(["--sizes", "5", "--layers", "2", "--iters", "1", "--json", str(tmp_path / "b.json")])
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [r["impl"] for r in rows] == ["reference", "xla"]
    assert all(r["us_per_layer"] > 0 and 0 < r["device_us_per_layer"] < float("inf") for r in rows)
    assert rows[1]["rel_err_vs_reference"] < 1e-4
    # bytes a layer moves: q, k (N x 16 x 128), v (N x 48 x 128), g, beta, the ancestor mask and the fp32 state
    # in; the outputs (o, delta, G) out; over its device time, against the copy of the same run
    state = arg_specs.REAL_HEADS * arg_specs.REAL_DK * arg_specs.REAL_DV * 4
    per_node = 2 * arg_specs.REAL_KEY_HEADS * arg_specs.REAL_DK + arg_specs.REAL_HEADS * (3 * arg_specs.REAL_DV + 3)
    small = 5 * per_node * 4 + 25                                                       # N = 5
    assert all(r["bytes_per_layer"] == state + small for r in rows)
    assert all(r["frac_of_copy"] == pytest.approx(r["bytes_per_s"] / json.loads((tmp_path / "b.json").read_text())[
        "copy_bytes_per_s"]) for r in rows)
    bench.main(["--sizes", "5", "--layers", "1", "--iters", "1", "--impls", "xla", "--json", str(tmp_path / "x.json")])
    assert [r["impl"] for r in json.loads((tmp_path / "x.json").read_text())["rows"]] == ["xla"]
    with pytest.raises(SystemExit):
        bench.main(["--impls", "pallas_mosaic"])


def test_bench_error_is_against_the_reference(tmp_path, monkeypatch):
    """The error column compares every implementation with the reference, computed apart from the timed ones: a
    wrong kernel timed alone (`--impls`) is not compared with itself."""
    import json

    from pallas_kernels.tree_delta_rule import bench

    def wrong(*a):
        o, d, G = xla.tree_delta_rule(*a)
        return 2 * o, 2 * d, G
    monkeypatch.setattr(bench, "implementations", lambda sweep, on_gpu: {
        "reference": reference.tree_delta_rule, "xla": xla.tree_delta_rule, "pallas_triton": wrong})
    bench.main(["--sizes", "2", "--layers", "1", "--iters", "1", "--impls", "pallas_triton",
                "--json", str(tmp_path / "b.json")])
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [r["impl"] for r in rows] == ["pallas_triton"] and rows[0]["rel_err_vs_reference"] > 0.5, rows


@pytest.mark.parametrize("n", [16, 40])
def test_bench_sweep_variants_match_reference(seed, n):
    """Every structural variant the GPU bench's `--sweep` times (its keyword sets; the tile-size variants are
    test_kernel_real_head_dims'), run in interpret mode, equals the reference."""
    from pallas_kernels.tree_delta_rule import bench
    args, _ = make_inputs(seed, Spec(1, n, 4, 16, 16, "tree", key_heads=2))
    ref = reference.tree_delta_rule(*args)
    variants = {k: v for k, v in bench.implementations(True, True).items()
                if k.startswith("pallas_triton/") and "/dv" not in k}
    assert "pallas_triton/gram_ieee" in variants
    for name, fn in variants.items():
        assert_matches(fn(*args, interpret=True), ref)


def test_bench_layers_depend_on_each_other(seed):
    """Each stacked layer gets keys, log-decays and a state moved by the previous layer's output, so XLA cannot
    compute the parts that do not touch the state once for all layers."""
    from pallas_kernels.tree_delta_rule import bench
    args, _ = make_inputs(seed, Spec(1, 5, 2, 16, 16, "chain"))
    q, k, v, g, beta, anc, s0 = args
    seen = lambda q, k, v, g, beta, anc, s: (k, jnp.ones_like(v), g)         # a layer that shows its inputs
    (k2, _, g2), s2 = bench.stacked(seen, 2)(*args)
    for name, x, x0 in (("k", k2, k), ("g", g2, g), ("state", s2, s0)):
        assert not np.array_equal(np.asarray(x), np.asarray(x0)), name
        assert np.allclose(np.asarray(x), np.asarray(x0), atol=1e-5), name


# ---------------------------------------------------------------------------------------------- GPU
# Reference: reference.py on the same GPU in fp32 with HIGHEST-precision dots (no tf32) and cuBLAS
# trsm. Bound 1e-4 on max |x - ref| / max |ref|, as on the CPU.

REAL = dict(heads=arg_specs.REAL_HEADS, dk=arg_specs.REAL_DK, dv=arg_specs.REAL_DV, key_heads=arg_specs.REAL_KEY_HEADS)


@on_gpu
@pytest.mark.parametrize("precision", sorted(pallas_triton.PRECISIONS))
@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("n", arg_specs.VERIFY_SIZES)
def test_gpu_kernel_matches_reference(seed, n, shape, precision):
    args, _ = make_inputs(seed, Spec(2, n, shape=shape, **REAL))
    out = jax.jit(lambda *a: pallas_triton.tree_delta_rule(*a, precision=precision))(*args)
    assert_matches(out, jax.jit(reference.tree_delta_rule)(*args))


@on_gpu
@pytest.mark.parametrize("n", [17, 64, 65])
def test_gpu_kernel_ragged_and_correlated(seed, n):
    for spec in (Spec(2, n, shape="ragged", **REAL), Spec(2, n, shape="chain", correlated=True, **REAL)):
        args, _ = make_inputs(seed, spec)
        assert_matches(jax.jit(pallas_triton.tree_delta_rule)(*args), jax.jit(reference.tree_delta_rule)(*args))


@on_gpu
@pytest.mark.parametrize("block_dv,key_chunk,num_warps", [(32, 32, 4), (128, 32, 4), (64, 64, 8), (64, 16, 4)])
def test_gpu_kernel_tuning_variants(seed, block_dv, key_chunk, num_warps):
    args, _ = make_inputs(seed, Spec(1, 65, shape="tree", **REAL))
    fn = jax.jit(lambda *a: pallas_triton.tree_delta_rule(*a, block_dv=block_dv, key_chunk=key_chunk,
                                                         num_warps=num_warps))
    assert_matches(fn(*args), jax.jit(reference.tree_delta_rule)(*args))


# The opt-in variants, compiled, at the real shape: the Gram products ahead of the kernels in fp32 FMA dots
# (gram_precision="ieee"; the default forms them in three tf32 passes).
GPU_VARIANTS = [({"gram_precision": "ieee"}, 64, "tree"), ({"gram_precision": "ieee"}, 65, "chain")]


@on_gpu
@pytest.mark.parametrize("options,n,shape", GPU_VARIANTS,
                         ids=lambda x: "-".join(f"{k}={v}" for k, v in x.items()) if isinstance(x, dict) else str(x))
def test_gpu_kernel_variants(seed, options, n, shape):
    args, _ = make_inputs(seed, Spec(2, n, shape=shape, **REAL))
    fn = jax.jit(lambda *a: pallas_triton.tree_delta_rule(*a, **options))
    assert_matches(fn(*args), jax.jit(reference.tree_delta_rule)(*args))


@on_gpu
@pytest.mark.parametrize("n", arg_specs.VERIFY_SIZES)
def test_gpu_default_dispatch(seed, n, monkeypatch):
    """With no flag the GPU runs the kernels (prepare + apply) for 2..128 nodes, the xla solver for one."""
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    args, _ = make_inputs(seed, Spec(1, n, shape="tree", **REAL))
    fn = jax.jit(api.tree_delta_rule)
    hlo = fn.lower(*args).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == (2 if n >= 2 else 0) and "triangular_solve" not in hlo
    assert_matches(fn(*args), jax.jit(reference.tree_delta_rule)(*args))


@on_gpu
@pytest.mark.parametrize("n", arg_specs.VERIFY_SIZES)
def test_gpu_xla_has_no_trsm(seed, n):
    args, _ = make_inputs(seed, Spec(2, n, shape="tree", **REAL))
    fn = jax.jit(xla.tree_delta_rule)
    assert "triangular_solve" not in fn.lower(*args).as_text()
    assert_matches(fn(*args), jax.jit(reference.tree_delta_rule)(*args))


@on_gpu
def test_gpu_chunked_prefill(seed):
    """The model's chain path: 3 chunks of 64 through the kernel inside lax.scan, the state carried."""
    from jaxspec import tree as tree_lib
    from jaxspec.model import delta_rule

    n = 130
    args, _ = make_inputs(seed, Spec(1, n, shape="chain", **REAL))
    q, k, v, g, beta, anc, s0 = args
    tree = tree_lib.chain(1, n)
    outs = {}
    for impl in ("pallas_triton", "reference"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(api.ENV_VAR, impl)                 # read when this fresh jit traces
            outs[impl] = jax.jit(lambda *a: delta_rule(*a, tree, s0))(q, k, v, g, beta)
    assert_matches(outs["pallas_triton"][:3], outs["reference"][:3])
    assert rel_err(outs["pallas_triton"][3], outs["reference"][3]) < BOUND
