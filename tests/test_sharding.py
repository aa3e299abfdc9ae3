"""Tensor and data parallelism (jaxspec/sharding.py) on 8 simulated CPU devices (tests/conftest.py):
sharded == unsharded for logits and for greedy AR / DFlash / DDTree tokens, sharded loading straight
from (sharded) HF checkpoints and from Orbax, the collectives of the compiled round, degree errors.

The tiny target has 8 query heads, 2 kv heads, 8 GDN key heads (16 value heads) and a vocabulary of
509: TP 2 splits the kv heads, TP 4 and 8 repeat them, and every degree pads the vocabulary."""

import collections
import importlib
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import make_causal_lm
from convert.hf import load_target
from convert.keys import gdn_channel_order, gdn_channels
from convert.store import load_model, restore_converted, save_converted
from jaxspec import sharding as S
from jaxspec import tree as trees
from jaxspec.config import ConfigError
from jaxspec.dflash import DFlash
from jaxspec.drafter import Drafter
from jaxspec.engine import Decoding, Engine
from jaxspec.model import init_state
from jaxspec.sampling import Sampling, log_probs
from oracle import OracleChain, OracleTree, reference
from test_dflash import drafter_config

SHAPE = dict(vocab_size=509, num_attention_heads=8, num_key_value_heads=2, linear_num_key_heads=8,
             linear_num_value_heads=16, linear_key_head_dim=8, linear_value_head_dim=8)
slow = pytest.mark.slow
# (tp, dp): the fast default covers kv heads repeated, data parallel and vocabulary padding.
MESHES = [(4, 2), pytest.param(2, 1, marks=slow), pytest.param(8, 1, marks=slow)]


def same_spec(array, axes):
    want = jax.sharding.NamedSharding(array.sharding.mesh, S.spec(axes))
    return array.sharding.is_equivalent_to(want, array.ndim)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp_target")
    make_causal_lm(path, seed=4, max_shard_size="100KB", **SHAPE)
    return path


@pytest.fixture(scope="module")
def target(ckpt):
    return load_target(ckpt, dtype="float32")


@pytest.fixture(scope="module")
def target_dk16(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp_target_dk16")
    make_causal_lm(path, seed=5, max_shard_size="100KB", **{**SHAPE, "linear_key_head_dim": 16,
                                                            "linear_value_head_dim": 16})
    return load_target(path, dtype="float32")


@pytest.fixture(scope="module")
def drafter():
    return Drafter(drafter_config(vocab_size=509, mask_token_id=500, num_heads=8, num_kv_heads=2),
                   rngs=nnx.Rngs(3))


def flat(model):
    return {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(model))}


def forward(model, tokens, tree, state, mesh=None):
    gd, params = nnx.split(model)
    f = jax.jit(lambda p, t, s, tr: nnx.merge(gd, p)(t, s, tr)[0])
    if mesh is None:
        return f(params, tokens, state, tree)
    with jax.set_mesh(mesh):
        return f(params, tokens, state, tree)


def logits_of(model, mesh=None, b=2):
    rng = np.random.RandomState(0)
    tokens = jnp.asarray(rng.randint(0, 509, (b, 40)))
    make = lambda: init_state(model.cfg, b, 96)
    state = S.state_maker(mesh, make)()
    full = forward(model, tokens, trees.chain(b, 40), state, mesh)
    parent = jnp.asarray([[-1, 0, 0, 1, 2, 4, 4, 5]] * b)
    tree_logits = forward(model, tokens[:, :8], trees.from_parents(parent), state, mesh)
    return np.asarray(full), np.asarray(tree_logits)


def test_layouts(target):
    cfg = target.cfg
    assert S.tp_config(cfg, 2).num_kv_heads == 2 and S.tp_config(cfg, 2).padded_vocab == 510
    assert S.tp_config(cfg, 8).num_kv_heads == 8 and S.tp_config(cfg, 8).padded_vocab == 512
    # Key-head-group order: head h's q, k, then its value heads; a permutation.
    order = gdn_channel_order(*gdn_channels(cfg))
    assert sorted(order) == list(range(cfg.conv_dim))
    assert list(order[:8]) == list(range(8)) and list(order[8:16]) == list(range(64, 72))
    assert list(order[16:32]) == list(range(128, 144))


@pytest.mark.parametrize("tp,dp", MESHES)
def test_logits_sharded_equal_unsharded(target, tp, dp):
    ref = logits_of(target)
    mesh = S.make_mesh(tp, dp)
    sharded = S.shard_target(target, mesh)
    assert sharded.cfg.num_kv_heads == max(2, tp)
    emb = sharded.embed_tokens[...]
    assert emb.shape[0] % tp == 0 and same_spec(emb, ("vocab", "embed"))
    got = logits_of(sharded, mesh)
    for r, g in zip(ref, got):
        assert np.isneginf(g[..., 509:]).all()
        np.testing.assert_allclose(g[..., :509], r, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("tp,dp", [(8, 1), pytest.param(2, 2, marks=slow)])
def test_greedy_tokens_identical(target, drafter, tp, dp):
    rs = np.random.RandomState(tp)
    prompts = [rs.randint(0, 509, size=n).tolist() for n in (7, 30)]
    mesh = S.make_mesh(tp, dp)
    st, sd = S.shard_target(target, mesh), S.shard_drafter(drafter, mesh)
    assert same_spec(sd.layers[0].self_attn.q_proj.kernel[...], ("embed", "heads"))
    for spec, sspec in ((None, None), (DFlash(drafter, target.cfg), DFlash(sd, st.cfg)),
                        (DFlash(drafter, target.cfg, budget=12), DFlash(sd, st.cfg, budget=12))):
        ref = Engine(target, spec).generate(prompts, 20, rounds_per_call=4)
        out = Engine(st, sspec, mesh=mesh).generate(prompts, 20, rounds_per_call=4)
        assert out.tokens == ref.tokens, getattr(spec, "name", "ar")
        np.testing.assert_array_equal(out.hist, ref.hist)
        state = out.final.state
        assert same_spec(state.ssm[0], S.STATE_AXES["ssm"]) and same_spec(state.conv[0], S.STATE_AXES["conv"])
        assert same_spec(state.keys[0], S.STATE_AXES["keys"])


@pytest.mark.parametrize("tp, dp", [(4, 2)])
def test_sharded_rounds_lossless_with_accepted_drafts(target, tp, dp):
    """Random drafters are almost never accepted, so the identity above mostly commits one token a round.
    Oracle drafters (tests/oracle.py) are: the sharded engine's multi-token accept and commit (chains and
    off-spine tree branches) must give the unsharded greedy AR tokens. Not at TP 2 x DP 1: there XLA's CPU
    compiler aborts in its TopkDecomposer (an optimization barrier taken for a tuple element) on the
    oracle tree's own top-k; the chain passes there, and the real DDTree compiles at TP 2 (test above)."""
    prompts = [np.random.RandomState(11).randint(0, 509, size=n).tolist() for n in (9, 26)]
    n_new = 24
    ar = Engine(target).generate(prompts, n_new).tokens
    mesh = S.make_mesh(tp, dp)
    st = S.shard_target(target, mesh)
    assert Engine(st, mesh=mesh).generate(prompts, n_new).tokens == ar
    block = 5
    out = Engine(st, OracleChain(block, 509, ref=reference(prompts, ar, block)), mesh=mesh).generate(
        prompts, n_new, seed=1, rounds_per_call=4)
    assert out.tokens == ar
    assert (out.hist[2:] > 0).sum() >= 2, out.hist          # rounds that accepted 2+ drafted tokens
    depth, budget = 3, 6
    out = Engine(st, OracleTree(depth, budget, 509, reference(prompts, ar, depth + 1)), mesh=mesh).generate(
        prompts, n_new, seed=2, rounds_per_call=4)
    assert out.tokens == ar
    assert int(np.asarray(out.final.draft["off_spine"]).sum()) > 0, "no sibling branch was accepted"


def test_generate_again_compiles_nothing(target, drafter, caplog):
    """A second generate of the same batch and length on a sharded engine compiles nothing: the empty
    states are made by makers jitted once per (batch, max_len), not by a fresh jit per call."""
    mesh = S.make_mesh(2, 1)
    st, sd = S.shard_target(target, mesh), S.shard_drafter(drafter, mesh)
    eng = Engine(st, DFlash(sd, st.cfg), mesh=mesh)
    first = eng.generate([[5, 6, 7]], 6, max_len=64, rounds_per_call=2)
    with jax.log_compiles(True), caplog.at_level("WARNING"):
        again = eng.generate([[9, 8, 7, 6]], 6, max_len=64, rounds_per_call=2)
    compiled = [r.getMessage()[:120] for r in caplog.records if "ompil" in r.getMessage()]
    assert compiled == [], compiled
    assert len(first.tokens[0]) == len(again.tokens[0]) == 6


@pytest.mark.parametrize("tp,dp", [(8, 1), (2, 2), pytest.param(4, 1, marks=slow)])
def test_load_reads_shards_straight_from_the_files(ckpt, target, tp, dp, monkeypatch):
    """load_target(mesh=) == shard_target(load_target()), bit for bit, without ever reading whole tensors."""
    from safetensors import safe_open
    mesh = S.make_mesh(tp, dp)
    whole = []
    real = safe_open

    class Spy:
        def __init__(self, *a, **k):
            self.f = real(*a, **k)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *a):
            return self.f.__exit__(*a)

        def get_tensor(self, key):
            whole.append(key)
            return self.f.get_tensor(key)

        def get_slice(self, key):
            return self.f.get_slice(key)

        def keys(self):
            return self.f.keys()

    import convert.hf
    monkeypatch.setattr(convert.hf, "safe_open", Spy)
    loaded = load_target(ckpt, dtype="float32", mesh=mesh)
    assert whole == []
    monkeypatch.undo()
    want = S.shard_target(target, mesh)
    assert loaded.cfg == want.cfg
    a, b = flat(loaded), flat(want)
    for p in b:
        assert a[p].sharding.is_equivalent_to(b[p].sharding, b[p].ndim), p
        np.testing.assert_array_equal(np.asarray(a[p]), np.asarray(b[p]), err_msg=str(p))


def test_orbax_restore_on_a_mesh(ckpt, target, tmp_path):
    out = save_converted(target, tmp_path / "conv", ckpt)
    mesh = S.make_mesh(8, 1)
    restored = load_model(out, mesh=mesh)
    want = S.shard_target(target, mesh)
    a, b = flat(restored), flat(want)
    for p in b:
        assert a[p].sharding.is_equivalent_to(b[p].sharding, b[p].ndim), p
        np.testing.assert_array_equal(np.asarray(a[p]), np.asarray(b[p]), err_msg=str(p))


@pytest.mark.parametrize("version", [1, 2])
def test_old_orbax_dirs_are_upgraded(ckpt, target, tmp_path, version):
    """Versions 1 and 2 stored the checkpoint's separate kernels, version 1 with the GDN's q|k|v channels in HF
    order; restoring one (unsharded, or on a TP 8 mesh that repeats the kv heads) gives today's fused model."""
    import shutil
    from convert.store import PARAMS, write_tree
    from jaxspec.model import split_params
    cfg = target.cfg
    old = split_params(cfg, flat(load_target(ckpt, dtype="float32")))
    assert ("layers", 0, "mlp", "gate_proj", "kernel") in old and not any("gate_up_proj" in map(str, p) for p in old)
    if version == 1:
        inverse = np.argsort(gdn_channel_order(*gdn_channels(cfg)))
        for p in old:
            if str(p[-1]) == "conv1d" or (len(p) > 1 and str(p[-2]) == "in_proj_qkv"):
                old[p] = old[p][:, inverse]
    out = save_converted(target, tmp_path / "old", ckpt)
    shutil.rmtree(out / PARAMS)
    write_tree(old, out / PARAMS)
    meta = json.loads((out / "jaxspec.json").read_text())
    (out / "jaxspec.json").write_text(json.dumps({**meta, "version": version}))
    a, b = flat(restore_converted(out)), flat(target)
    assert set(a) == set(b)
    for p in b:
        np.testing.assert_array_equal(np.asarray(a[p]), np.asarray(b[p]), err_msg=str(p))
    mesh = S.make_mesh(8, 1)
    a, b = flat(load_model(out, mesh=mesh)), flat(S.shard_target(target, mesh))
    for p in b:
        assert a[p].sharding.is_equivalent_to(b[p].sharding, b[p].ndim), p
        np.testing.assert_array_equal(np.asarray(a[p]), np.asarray(b[p]), err_msg=str(p))


def collectives(hlo: str) -> collections.Counter:
    return collections.Counter(re.findall(
        r"= [^ ]+ (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(", hlo))


SAMPLED = [Sampling(0.7, 20, 0.9), Sampling(0.7, top_p=0.9)]


@pytest.mark.parametrize("sampling", [Sampling()] + SAMPLED, ids=str)
def test_compiled_round_has_two_all_reduces_per_layer(target, drafter, sampling):
    """AR, DFlash and DDTree rounds at TP 4: two all-reduces of the residual per target layer, and no all-gather
    of anything larger than a per-shard scalar per token (the sharded argmax) or, sampled with top-k, the
    shards' k candidates per token; no sort of the vocabulary (top-p cuts by a search or from the candidates)."""
    check_round_collectives(target, drafter, 4, sampling)


@pytest.mark.gpu
@pytest.mark.parametrize("tp", [2, 4])
def test_gpu_round_has_two_all_reduces_per_layer(target, drafter, tp):
    """The same on GPUs at TP 2 and 4: the GPU partitioner made other choices than the CPU's (it gathered the
    whole embedding table every step until the lookup was written per shard), so check its program too."""
    if jax.default_backend() != "gpu" or jax.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs: JAX_PLATFORMS=cuda python -m pytest tests/test_sharding.py -m gpu")
    check_round_collectives(target, drafter, tp)


def check_round_collectives(target, drafter, tp, sampling=Sampling()):
    mesh = S.make_mesh(tp, 1)
    st, sd = S.shard_target(target, mesh), S.shard_drafter(drafter, mesh)
    for spec in (None, DFlash(sd, st.cfg)) + (() if sampling.greedy else (DFlash(sd, st.cfg, budget=12),)):
        eng = Engine(st, spec, sampling=sampling, mesh=mesh)
        _, state, draft, key = eng.prefill([[1, 2, 3]], 64)
        n = eng.spec.tree_size
        d = Decoding(state, draft, jnp.ones((1,), jnp.int32), jnp.zeros((1, 8), jnp.int32),
                     jnp.ones((1,), jnp.int32), jnp.zeros((1,), bool), key, jnp.zeros((1, n + 1), jnp.int32),
                     jnp.zeros((1,), jnp.int32))
        hlo = eng._run.lower(eng.params, d, 8, 4).compile().as_text()
        ops = collectives(hlo)
        h = target.cfg.hidden_size
        # [1, n, h] on the CPU; the GPU's program drops the unit dimensions ([h] for one token)
        residual = [l for l in hlo.splitlines()
                    if re.search(rf"= f32\[(?:1,)?(?:{n},)?{h}\]\S* all-reduce(-start)?\(", l)]
        layers = target.cfg.num_layers + (0 if spec is None else 2 * sd.cfg.num_layers)
        assert len(residual) >= 2 * target.cfg.num_layers, ops
        # Sampling adds all-reduces of one float per token (the transform's maxima and sums, the search's)
        per_token = [d for d in re.findall(r"= [fs]32\[([\d,]*)\]\S* all-reduce(?:-start)?\(", hlo)
                     if np.prod([int(x) for x in d.split(",") if x]) <= n]
        others = ops["all-reduce"] - (0 if sampling.greedy else len(per_token))
        if spec is None:    # AR: the embedding lookup's (per shard) and two a layer, no more of the residual's size
            assert len(residual) == 2 * target.cfg.num_layers + 1, (len(residual), ops)
        # At TP 4 on the CPU: AR 9-10 for 4 layers, DFlash / DDTree 13-16 for 8 (the drafter's): no layer has a third.
        assert others <= 2 * layers + 2, (others, ops)
        for line in hlo.splitlines():
            m = re.search(r"= (\w+)\[([\d,]*)\][^ ]* all-gather(-start)?\(", line)
            if m:
                size = np.prod([int(x) for x in m.group(2).split(",") if x])
                assert size <= tp * n * max(16, sampling.top_k), line[:200]
        vocab = st.cfg.vocab_rows
        assert not re.search(rf"\b(?:{vocab}|{vocab // tp})\]\S*\)? sort\(", hlo), "the vocabulary is sorted"
        assert ops["all-to-all"] == 0 and ops["reduce-scatter"] == 0, ops


@pytest.mark.parametrize("tp, dp", [(4, 2), (2, 1)])
def test_embedding_lookup_reads_only_the_local_rows(target, tp, dp):
    """The embedding lookup on a vocabulary-split table: each shard takes its own rows and one psum of
    [..., D] combines them, explicitly (shard_map), so no partitioner can gather the table instead: the
    GPU's did, 2.5 GB per step at the real shape (bench/results/2026-11-30-h200x2-tp-probe). Values equal
    the unsharded lookup for ids in every shard, the padded rows' neighbours included."""
    mesh = S.make_mesh(tp, dp)
    st = S.shard_target(target, mesh)
    ids = jnp.asarray(np.random.RandomState(1).permutation(np.r_[0:509, 0, 127, 128]).reshape(2, 256))
    with jax.set_mesh(mesh):
        f = jax.jit(lambda t, i: st.__class__.embed(nnx.merge(nnx.graphdef(st), t), i))
        got = f(nnx.state(st), ids)
        jaxpr = str(jax.make_jaxpr(lambda t, i: nnx.merge(nnx.graphdef(st), t).embed(i))(nnx.state(st), ids))
        hlo = f.lower(nnx.state(st), ids).compile().as_text()
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.take(target.embed_tokens[...], ids, axis=0)))
    assert "shard_map" in jaxpr and "psum" in jaxpr, jaxpr[:2000]
    rows = st.cfg.vocab_rows
    assert not re.search(rf"\[{rows},{target.cfg.hidden_size}\]\S* all-gather", hlo), "the table is gathered"


@pytest.mark.parametrize("flag", ["JAXSPEC_TREE_DELTA_RULE", "JAXSPEC_TREE_ATTENTION", "JAXSPEC_GDN_TREE_INPUTS"])
def test_pallas_kernel_runs_per_shard(request, monkeypatch, flag):
    """With a Pallas kernel selected, the sharded forward traces the kernel on per-shard shapes (1 of the
    2 sequences, a quarter of the heads: of the query heads, of the GDN's key heads, or of the in_proj
    product's key-head groups) through shard_map, and matches. The GDN tree inputs kernel takes head dims of 16
    or more (Triton's dot, power-of-two tiles), so it runs on a target with those."""
    gdn16 = flag == "JAXSPEC_GDN_TREE_INPUTS"
    target = request.getfixturevalue("target_dk16" if gdn16 else "target")
    from pallas_kernels.gdn_tree_inputs import pallas_triton as inputs_kernel
    from pallas_kernels.tree_attention import pallas_triton as attention_kernel
    from pallas_kernels.tree_delta_rule import pallas_triton as delta_kernel
    monkeypatch.setenv(flag, "pallas_interpret")
    module, fn_name = {"JAXSPEC_TREE_ATTENTION": (attention_kernel, "tree_attention"),
                       "JAXSPEC_TREE_DELTA_RULE": (delta_kernel, "tree_delta_rule"),
                       "JAXSPEC_GDN_TREE_INPUTS": (inputs_kernel, "gdn_tree_inputs")}[flag]
    shapes, kernel = [], getattr(module, fn_name)
    monkeypatch.setattr(module, fn_name, lambda q, *a, **kw: shapes.append(q.shape) or kernel(q, *a, **kw))
    mesh = S.make_mesh(4, 2)
    sharded = S.shard_target(target, mesh)
    b = 2
    tokens = jnp.asarray(np.random.RandomState(1).randint(0, 509, (b, 8)))
    parent = jnp.asarray([[-1, 0, 0, 1, 2, 4, 4, 5]] * b)
    tr = trees.from_parents(parent)
    gd, params = nnx.split(sharded)
    state = S.state_maker(mesh, lambda: init_state(sharded.cfg, b, 32))()
    f = jax.jit(lambda p, t, s, tr: nnx.merge(gd, p)(t, s, tr)[0])
    with jax.set_mesh(mesh):
        hlo = f.lower(params, tokens, state, tr).as_text()
        got = f(params, tokens, state, tr)
    assert "sdy.manual_computation" in hlo or "shard_map" in hlo
    cfg = target.cfg
    heads = {"JAXSPEC_TREE_ATTENTION": cfg.num_heads, "JAXSPEC_TREE_DELTA_RULE": cfg.linear_num_key_heads,
             "JAXSPEC_GDN_TREE_INPUTS": cfg.conv_dim + cfg.value_dim + 2 * cfg.linear_num_value_heads}[flag] // 4
    assert shapes and {(s[0], s[2]) for s in shapes} == {(1, heads)}, shapes
    monkeypatch.delenv(flag)
    ref = forward(target, tokens, tr, init_state(target.cfg, b, 32))
    np.testing.assert_allclose(np.asarray(got)[..., :509], np.asarray(ref), rtol=2e-5, atol=2e-5)


def test_chain_delta_rule_runs_per_shard(target, monkeypatch):
    """A prefill of 80 tokens (two blocks of 64) with the tree delta rule's kernels selected runs the chain delta
    rule per shard: its block factors on one sequence of the two and a quarter of the key heads, its state pass on
    a quarter of the value heads. The committed states and the logits of the committed tokens match the unsharded
    forward on the jnp solvers (row 1 commits 50 of the 80 tokens)."""
    from pallas_kernels.tree_delta_rule import pallas_triton as delta_kernel
    monkeypatch.setenv("JAXSPEC_TREE_DELTA_RULE", "pallas_interpret")
    shapes = {}
    for name in ("block_factors", "state_pass"):
        kernel = getattr(delta_kernel, name)
        monkeypatch.setattr(delta_kernel, name, lambda x, *a, _k=kernel, _n=name, **kw:
                            shapes.setdefault(_n, set()).add(x.shape) or _k(x, *a, **kw))
    mesh = S.make_mesh(4, 2)
    sharded = S.shard_target(target, mesh)
    b, p = 2, 80
    tokens = jnp.asarray(np.random.RandomState(2).randint(0, 509, (b, p)))
    n = jnp.asarray([p, 50], jnp.int32)
    run = lambda model, state: jax.jit(lambda prm, t, s, m: nnx.merge(nnx.graphdef(model), prm)(
        t, s, trees.chain(b, p), commit_n=m))(nnx.state(model), tokens, state, n)
    with jax.set_mesh(mesh):
        logits, _, got, _ = run(sharded, S.state_maker(mesh, lambda: init_state(sharded.cfg, b, 96))())
    cfg = target.cfg
    assert shapes["block_factors"] == {(2, 64, cfg.linear_num_key_heads // 4, cfg.linear_key_head_dim)}, shapes
    assert {x[2] for x in shapes["state_pass"]} == {cfg.linear_num_value_heads // 4}, shapes
    monkeypatch.delenv("JAXSPEC_TREE_DELTA_RULE")
    ref_logits, _, ref, _ = run(target, init_state(cfg, b, 96))
    for row, real in enumerate(np.asarray(n)):
        np.testing.assert_allclose(np.asarray(logits)[row, :real, :509], np.asarray(ref_logits)[row, :real],
                                   rtol=2e-5, atol=2e-5)
    for x, y in zip(got.ssm, ref.ssm):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-5)


def test_chain_attention_runs_per_shard(target, monkeypatch):
    """Two prefill pieces of 12 tokens with the chain attention op's split selected (interpreted): the second piece
    reads the first through the prefix kernel and merges it with its own causal attention, per shard (one sequence
    of the two, a quarter of the query heads). Its logits match the unsharded forward on the tree op."""
    from pallas_kernels.tree_attention import pallas_triton as attention_kernel
    monkeypatch.setenv("JAXSPEC_CHAIN_ATTENTION", "pallas_interpret")
    shapes = []
    kernel = attention_kernel.prefix_partials
    monkeypatch.setattr(attention_kernel, "prefix_partials", lambda q, *a, **kw: shapes.append(q.shape) or
                        kernel(q, *a, **kw))
    mesh = S.make_mesh(4, 2)
    sharded = S.shard_target(target, mesh)
    b, p = 2, 12
    pieces = jnp.asarray(np.random.RandomState(3).randint(0, 509, (2, b, p)))
    n = jnp.full((b,), p, jnp.int32)

    def run(model, state):
        f = jax.jit(lambda prm, t, s: nnx.merge(nnx.graphdef(model), prm)(t, s, trees.chain(b, p), commit_n=n))
        _, _, state, _ = f(nnx.state(model), pieces[0], state)
        logits, _, state, _ = f(nnx.state(model), pieces[1], state)
        return logits, state

    with jax.set_mesh(mesh):
        logits, got = run(sharded, S.state_maker(mesh, lambda: init_state(sharded.cfg, b, 32))())
    assert shapes and set(shapes) == {(1, p, target.cfg.num_heads // 4, target.cfg.head_dim)}, shapes
    monkeypatch.delenv("JAXSPEC_CHAIN_ATTENTION")
    ref_logits, ref = run(target, init_state(target.cfg, b, 32))
    np.testing.assert_allclose(np.asarray(logits)[..., :509], np.asarray(ref_logits), rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(got.length), np.asarray(ref.length))


@pytest.mark.parametrize("kernel", ["gdn_decode", "add_rms_norm"])
def test_opt_in_kernel_runs_per_shard(target, monkeypatch, kernel):
    """The opt-in kernels (the fused GDN decode step, the fused residual add + RMSNorm) under tensor + data
    parallelism: traced on per-shard shapes (1 of the 2 sequences; for the GDN step a quarter of the
    key-head groups' channels, for the norm whole rows), and greedy AR through them equals the unsharded
    model's without them."""
    import importlib
    api = importlib.import_module(f"pallas_kernels.{kernel}.api")
    module = importlib.import_module(f"pallas_kernels.{kernel}.pallas_triton")
    rs = np.random.RandomState(5)
    prompts = [rs.randint(0, 509, size=n).tolist() for n in (6, 13)]
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    ref = Engine(target).generate(prompts, 12).tokens
    shapes, fn = [], getattr(module, kernel)
    monkeypatch.setattr(module, kernel, lambda x, *a, **kw: shapes.append(x.shape) or fn(x, *a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    mesh = S.make_mesh(4, 2)
    out = Engine(S.shard_target(target, mesh), mesh=mesh).generate(prompts, 12).tokens
    assert out == ref
    want = target.cfg.conv_dim // 4 if kernel == "gdn_decode" else target.cfg.hidden_size
    assert shapes and {(s[0], s[-1]) for s in shapes} == {(1, want)}, shapes


@pytest.mark.parametrize("flag", ["pallas_interpret", "xla"])
def test_verify_runs_per_vocab_shard(target, drafter, monkeypatch, flag):
    """The verify op per vocabulary shard (sharding.vocab_choice): greedy and Gumbel-max choices equal the
    unsharded op's, with padding columns at -inf and ties; only the shards' [rows, tp] bests are gathered;
    and greedy DDTree through the engine stays token-identical."""
    from jaxspec.sampling import Sampling, choose
    from pallas_kernels.verify import api
    monkeypatch.setenv(api.ENV_VAR, flag)
    shapes, partial = [], api.choice_partial
    monkeypatch.setattr(api, "choice_partial",
                        lambda k, rows, *a, **kw: shapes.append(rows.shape) or partial(k, rows, *a, **kw))
    mesh = S.make_mesh(4, 2)
    x = jnp.round(jax.random.normal(jax.random.key(0), (4, 3, 512)) * 2).at[..., 509:].set(-jnp.inf)
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None, "model")))
    key = jax.random.key(1)
    for t in (0.0, 0.9):
        f = jax.jit(lambda k, l: choose(k, l, Sampling(temperature=t)))
        shapes.clear()
        with jax.set_mesh(mesh):
            got = f(key, xs)
            hlo = f.lower(key, xs).compile().as_text()
        assert set(shapes) == {(6, 128)}    # traced per shard: 2 of the 4 sequences x 3 nodes, 512 / 4 columns
        np.testing.assert_array_equal(got, api.target_choice(key, x, t, implementation=flag))
        gathered = re.findall(r"= \w+\[([\d,]*)\][^ ]* all-gather(?:-start)?\(", hlo)
        assert gathered and all(np.prod([int(d) for d in g.split(",")]) <= 6 * 4 for g in gathered), gathered
    prompts = [[5, 17, 300, 2], [9, 9, 400, 61, 7, 3]]
    st, sd = S.shard_target(target, mesh), S.shard_drafter(drafter, mesh)
    ref = Engine(target, DFlash(drafter, target.cfg, budget=12)).generate(prompts, 12, rounds_per_call=4)
    out = Engine(st, DFlash(sd, st.cfg, budget=12), mesh=mesh).generate(prompts, 12, rounds_per_call=4)
    assert out.tokens == ref.tokens


def test_mtp_sharded_equals_unsharded(target):
    """The MTP head laid out like the target (kv heads repeated at TP 4, data parallel 2): greedy MTP
    tokens, the acceptance histogram and the head's last drafts equal the unsharded engine's; sampled MTP (rejection
    sampling, top-k and top-p) gives the unsharded tokens for the same seed."""
    from jaxspec.mtp import MTP, MTPHead
    head = MTPHead(target.cfg, rngs=nnx.Rngs(3))
    mesh = S.make_mesh(4, 2)
    st, sh = S.shard_target(target, mesh), S.shard_mtp(head, mesh)
    assert sh.cfg.num_kv_heads == 4 and same_spec(sh.layers[0].self_attn.qkv_proj.kernel[...], ("embed", "kv_heads"))
    prompts = [[5, 17, 300, 2], [9, 9, 400, 61, 7, 3]]
    ref = Engine(target, MTP(head, target.cfg, 3)).generate(prompts, 14, rounds_per_call=4)
    out = Engine(st, MTP(sh, st.cfg, 3), mesh=mesh).generate(prompts, 14, rounds_per_call=4)
    assert out.tokens == ref.tokens
    np.testing.assert_array_equal(out.hist, ref.hist)
    np.testing.assert_array_equal(out.final.draft.drafts, ref.final.draft.drafts)
    assert same_spec(out.final.draft.keys, S.STATE_AXES["keys"])
    ref = Engine(target, MTP(head, target.cfg, 3), sampling=SAMPLED[0]).generate(prompts, 14, seed=3)
    out = Engine(st, MTP(sh, st.cfg, 3), sampling=SAMPLED[0], mesh=mesh).generate(prompts, 14, seed=3)
    assert out.tokens == ref.tokens


def test_degrees_that_do_not_divide_the_model_name_the_field(target, drafter):
    cfg = target.cfg
    with pytest.raises(ConfigError, match=r"num_attention_heads=8 is not a multiple of 3"):
        S.check_target(cfg, 3)
    with pytest.raises(ConfigError, match=r"linear_num_key_heads=8 is not a multiple of 16"):
        S.check_target(cfg.replace(num_heads=16, intermediate_size=256), 16)
    with pytest.raises(ConfigError, match=r"num_key_value_heads=3"):
        S.check_target(cfg.replace(num_heads=24, num_kv_heads=3), 2)
    with pytest.raises(ConfigError, match=r"--tp 4 does not divide the model: intermediate_size=102 is not a multiple "
                                          r"of 4"):
        S.check_target(cfg.replace(intermediate_size=102), 4)
    with pytest.raises(ConfigError, match=r"--tp 2 does not fit the DFlash drafter: num_key_value_heads=3"):
        S.check_drafter(drafter.cfg.replace(num_heads=24, num_kv_heads=3), 2)
    with pytest.raises(ConfigError, match=r"DFlash drafter: intermediate_size=100 is not a multiple of 8"):
        S.check_drafter(drafter.cfg.replace(intermediate_size=100), 8)
    with pytest.raises(ConfigError, match=r"needs 16 devices, but 8 are visible"):
        S.make_mesh(8, 2)


def test_a_model_already_laid_out_is_not_laid_out_again(target, drafter):
    """A tp layout's config no longer says how the unsharded model reads (kv heads repeated, vocabulary padded): laid
    out again for another degree, its config would disagree with its arrays (and an export would write the repeated
    kv heads). Refused, naming the degree it holds; the unsharded model lays out as ever."""
    for module, shard in [(target, S.shard_target), (drafter, S.shard_drafter)]:
        once = shard(module, S.make_mesh(2, 1))
        for tp in (2, 4):
            with pytest.raises(ConfigError, match=rf"^the {type(module).__name__} is already in a 2-way "
                                                  r"tensor-parallel layout; lay out the unsharded one"):
                shard(once, S.make_mesh(tp, 1))
        assert S.model_tp_degree(shard(module, S.make_mesh(4, 1))) == 4


BAD_MESHES = {   # mesh (names, shape) -> what the error names; "explicit" is jax.make_mesh's (1, 4) mesh
    "explicit": r"types \('Explicit', 'Explicit'\).*AxisType\.Auto",
    "x-y": r"axes \('x', 'y'\)", "dp-tp": r"axes \('dp', 'tp'\)", "1-D": r"axes \('model',\)",
    "model-data": r"axes \('model', 'data'\)", "mixed": r"types \('Auto', 'Explicit'\).*AxisType\.Auto"}


@pytest.mark.parametrize("kind", BAD_MESHES)
def test_meshes_jaxspec_cannot_shard_on_are_named(ckpt, target, drafter, kind):
    """A mesh with Explicit axes (jax.make_mesh's default in JAX 0.11), other axis names, or one axis: sharding,
    loading and the Engine raise a ConfigError naming what the mesh has and pointing to sharding.make_mesh,
    instead of a KeyError, or a shard_map spec mismatch deep inside the first generate."""
    from jax.sharding import AxisType, Mesh
    from jaxspec.mtp import MTPHead
    devs = np.array(jax.devices()[:4])
    mesh = {"explicit": lambda: jax.make_mesh((1, 4), (S.DATA, S.MODEL), devices=devs.tolist()),
            "x-y": lambda: Mesh(devs.reshape(2, 2), ("x", "y")),
            "dp-tp": lambda: Mesh(devs.reshape(1, 4), ("dp", "tp")),
            "1-D": lambda: Mesh(devs[:2], (S.MODEL,)),
            "model-data": lambda: Mesh(devs.reshape(4, 1), (S.MODEL, S.DATA)),
            "mixed": lambda: Mesh(devs.reshape(1, 4), (S.DATA, S.MODEL),
                                  axis_types=(AxisType.Auto, AxisType.Explicit))}[kind]()
    if kind == "explicit":
        assert mesh.axis_types == (AxisType.Explicit,) * 2
    st = S.shard_target(target, S.make_mesh(4, 1))
    head = MTPHead(target.cfg, rngs=nnx.Rngs(3))
    calls = {"shard_target": lambda: S.shard_target(target, mesh),
             "shard_drafter": lambda: S.shard_drafter(drafter, mesh),
             "shard_mtp": lambda: S.shard_mtp(head, mesh),
             "load": lambda: load_target(ckpt, dtype="float32", mesh=mesh),
             "tp_degree": lambda: S.tp_degree(mesh), "dp_degree": lambda: S.dp_degree(mesh),
             "Engine": lambda: Engine(st, mesh=mesh)}
    for name, call in calls.items():
        with pytest.raises(ConfigError, match=BAD_MESHES[kind] + r".*jaxspec\.sharding\.make_mesh\(tp, dp\)") as e:
            call()
        assert "('data', 'model')" in str(e.value), name
    with pytest.raises(ConfigError, match="must be a jax.sharding.Mesh"):
        Engine(st, mesh=(1, 4))
    assert S.check_mesh(S.make_mesh(4, 2)).shape == {S.DATA: 2, S.MODEL: 4}


def test_engine_names_a_model_not_laid_out_for_its_mesh(ckpt, target):
    """An unsharded model given with a mesh (or one laid out for another mesh of the same devices) fails in
    Engine() with a ConfigError saying to call sharding.shard_target (or load with mesh=), not with an
    IndivisibleError or incompatible devices in the first generate. Laid-out models are accepted."""
    mesh4, mesh2 = S.make_mesh(4, 1), S.make_mesh(2, 1)
    fix = r"jaxspec\.sharding\.shard_target\(model, mesh\), or load it with mesh=mesh"
    for mesh in (mesh4, mesh2, S.make_mesh(1, 4)):
        with pytest.raises(ConfigError, match=r"the model is not laid out for this mesh.* is on device .*" + fix):
            Engine(target, mesh=mesh)
    with pytest.raises(ConfigError, match=r"not laid out for this mesh \(shape \{'data': 1, 'model': 4\}\).*"
                                          r"on a mesh of shape \{'data': 2, 'model': 2\}.*" + fix):
        Engine(S.shard_target(target, S.make_mesh(2, 2)), mesh=mesh4)
    Engine(S.shard_target(target, mesh4), mesh=S.make_mesh(4, 1))     # an equal mesh, built again
    Engine(load_target(ckpt, dtype="float32", mesh=mesh2), mesh=mesh2)


def test_unsharded_mtp_head_with_a_sharded_target_says_to_lay_it_out(target):
    """An unsharded MTP head with a target laid out for TP 4 (its 2 kv heads repeated to 4): the error says to
    lay the head out with sharding.shard_mtp, not that the head belongs to another target; the laid-out head
    is accepted, and a head of another shape still does not belong to the target."""
    from jaxspec.mtp import MTP, MTPHead
    head = MTPHead(target.cfg, rngs=nnx.Rngs(3))
    mesh = S.make_mesh(4, 1)
    st = S.shard_target(target, mesh)
    assert st.cfg.num_kv_heads == 4 > head.cfg.num_kv_heads
    with pytest.raises(ConfigError, match=r"num_kv_heads: head 2 vs target 4.*sharding\.shard_mtp\(head, mesh\)"):
        MTP(head, st.cfg, 2)
    assert MTP(S.shard_mtp(head, mesh), st.cfg, 2).cfg.num_kv_heads == 4
    with pytest.raises(ConfigError, match="does not belong to this target") as e:
        MTP(MTPHead(target.cfg.replace(hidden_size=32), rngs=nnx.Rngs(0)), st.cfg, 2)
    assert "shard_mtp" not in str(e.value)


def test_engine_names_a_speculator_not_laid_out_for_its_mesh(target, drafter):
    """An unsharded DFlash / DDTree drafter or MTP head with a target laid out for the mesh (or one laid out for
    another mesh) fails in Engine() with a ConfigError saying to call sharding.shard_drafter / shard_mtp. Before,
    the first generate failed deep in JAX: committed to one device, with incompatible devices; at TP 4 (the
    drafter's 2 kv heads fewer than the degree), with an IndivisibleError; and a drafter left uncommitted at TP 2
    ran, its whole weights resharded from one device on every call. Laid-out speculators are accepted."""
    from jaxspec.mtp import MTP, MTPHead
    head = MTPHead(target.cfg, rngs=nnx.Rngs(3))
    on_device = lambda m: nnx.merge(nnx.graphdef(m), jax.device_put(nnx.state(m), jax.devices()[0]))  # as load_mtp
    drafter_fix = r"jaxspec\.sharding\.shard_drafter\(drafter, mesh\)$"
    for tp, dp in ((2, 1), (4, 2), (2, 2)):
        mesh = S.make_mesh(tp, dp)
        st, other = S.shard_target(target, mesh), S.make_mesh(tp, 3 - dp)
        for d in (drafter, on_device(drafter), S.shard_drafter(drafter, other)):
            for budget in (None, 12):
                with pytest.raises(ConfigError, match=r"the DFlash drafter is not laid out for this mesh \(shape "
                                                      rf"\{{'data': {dp}, 'model': {tp}\}}\).*" + drafter_fix):
                    Engine(st, DFlash(d, st.cfg, budget=budget), mesh=mesh)
        Engine(st, DFlash(S.shard_drafter(drafter, mesh), st.cfg, budget=12), mesh=mesh)
        # At TP 4 MTP() itself refuses the unsharded head (its 2 kv heads not repeated to 4).
        for h in ((head, on_device(head)) if tp == 2 else ()) + (S.shard_mtp(head, other),):
            with pytest.raises(ConfigError, match=r"the MTP head is not laid out for this mesh.*"
                                                  r"jaxspec\.sharding\.shard_mtp\(head, mesh\)$"):
                Engine(st, MTP(h, st.cfg, 2), mesh=mesh)
        Engine(st, MTP(S.shard_mtp(head, mesh), st.cfg, 2), mesh=mesh)


def test_sampled_log_probs_run_per_vocab_shard(target, drafter):
    """The sampling transform on a vocabulary split 4 ways (TP 4 x DP 2, padding columns at -inf): the same kept
    tokens and log-probabilities as unsharded, with only the shards' top-k candidates gathered; and sampled AR,
    DFlash (rejection sampling) and DDTree give the unsharded engine's tokens for the same seed (every sample's
    noise is drawn per row, so the padded vocabulary's wider rows do not move it: reference.categorical)."""
    mesh = S.make_mesh(4, 2)
    x = jnp.round(jax.random.normal(jax.random.key(2), (4, 3, 512)) * 8) / 4
    x = x.at[..., 509:].set(-jnp.inf)
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None, "model")))
    for s in SAMPLED + [Sampling(1.0, 5)]:
        f = jax.jit(lambda l: log_probs(l, s))
        with jax.set_mesh(mesh):
            got = f(xs)
            hlo = f.lower(xs).compile().as_text()
        want = log_probs(x, s)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want), err_msg=str(s))
        np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-6, atol=1e-6)
        for g in re.findall(r"= \w+\[([\d,]*)\][^ ]* all-gather(?:-start)?\(", hlo):
            assert np.prod([int(d) for d in g.split(",")]) <= 2 * 3 * 4 * max(s.top_k, 1), (s, g)
    prompts = [[5, 17, 300, 2], [9, 9, 400, 61, 7, 3]]
    st, sd = S.shard_target(target, mesh), S.shard_drafter(drafter, mesh)
    # DDTree with top-k and top-p, DFlash with top-p alone, AR at a temperature alone (the verify op's path).
    for s, budget in ((SAMPLED[0], 12), (SAMPLED[1], None), (Sampling(0.7), "ar")):
        spec = lambda d, cfg: None if budget == "ar" else DFlash(d, cfg, budget=budget)
        ref = Engine(target, spec(drafter, target.cfg), sampling=s).generate(prompts, 12, seed=5)
        out = Engine(st, spec(sd, st.cfg), sampling=s, mesh=mesh).generate(prompts, 12, seed=5)
        assert out.tokens == ref.tokens, (s, budget)


class _Device:
    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_device_room_is_the_fullest_devices_free_bytes():
    devices = [_Device({"bytes_limit": 100, "bytes_in_use": 30}), _Device({"bytes_limit": 90, "bytes_in_use": 60})]
    assert S.device_room(devices) == (30, 90)
    assert S.device_room([*devices, _Device(None)]) is None        # one device without statistics: unknown
    assert S.device_room(jax.devices()[:1]) is None                # the CPU reports none


def test_room_problem_weighs_each_devices_share_of_a_state(target, monkeypatch):
    """A state is refused exactly when the fullest device's share of it (what its shards hold once allocated)
    exceeds the free bytes; this small state fits the CPU host's memory."""
    mesh = S.make_mesh(2, 2)
    cfg = S.shard_target(target, mesh).cfg
    make = lambda: init_state(cfg, 2, 40)
    state = S.state_maker(mesh, make)()
    leaves = jax.tree_util.tree_leaves(state)
    share = max(sum(s.data.nbytes for x in leaves for s in x.addressable_shards if s.device == d)
                for d in mesh.devices.flat)
    assert share < sum(x.nbytes for x in leaves)                   # sharded: less than the whole state
    abstract = jax.eval_shape(make)
    assert S.room_problem(abstract, mesh, "the state") is None
    monkeypatch.setattr(S, "device_room", lambda devices: (share, 4 * share))
    assert S.room_problem(abstract, mesh, "the state") is None
    monkeypatch.setattr(S, "device_room", lambda devices: (share - 1, 4 * share))
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.6")
    problem = S.room_problem(abstract, mesh, "the state")
    assert problem.startswith(f"the state needs {share / 2**30:.2f} GiB per device") and \
        "the pool is XLA_CLIENT_MEM_FRACTION=0.6 of its memory" in problem, problem


def test_room_problem_counts_each_leafs_own_dtype(monkeypatch):
    """A bf16 cache of 2 x 64 x 4 x 32 entries is 32768 bytes (2 each), plus an int32 [2] length: refused exactly
    when fewer bytes are free (on the CPU host, unsharded)."""
    abstract = {"keys": jax.ShapeDtypeStruct((2, 64, 4, 32), jnp.bfloat16), "length": jax.ShapeDtypeStruct((2,),
                                                                                                          jnp.int32)}
    need = 2 * 64 * 4 * 32 * 2 + 2 * 4
    monkeypatch.setattr(S, "host_room", lambda: (need, 2**31))
    assert S.room_problem(abstract, None, "the cache") is None
    monkeypatch.setattr(S, "host_room", lambda: (need - 1, 2**31))
    assert S.room_problem(abstract, None, "the cache").startswith("the cache needs 0.00 GiB")


def test_state_shards_follow_the_layout(target):
    """Under a (tp 4, dp 2) mesh each device holds, by the layout's arithmetic: one of the 2 sequences; a quarter of
    the 16 GDN value heads' states and conv channels; one of the 4 kv heads (2 in the checkpoint, each repeated
    twice); the whole length and head dims."""
    mesh = S.make_mesh(4, 2)
    cfg = S.shard_target(target, mesh).cfg
    state = S.state_maker(mesh, lambda: init_state(cfg, 2, 96))()
    conv_channels = 2 * 8 * 8 + 16 * 8          # q, k (8 key heads x 8) and v (16 value heads x 8)
    want = {"length": (1,), "keys": (1, 96, 1, cfg.head_dim), "values": (1, 96, 1, cfg.head_dim),
            "conv": (1, cfg.conv_kernel - 1, conv_channels // 4), "ssm": (1, 4, 8, 8)}
    for field, shape in want.items():
        leaves = getattr(state, field)
        for x in (leaves if isinstance(leaves, tuple) else (leaves,)):
            assert {s.data.shape for s in x.addressable_shards} == {shape}, (field, x.shape)
    # Other arrays (a round's pending tokens, output buffers): split on the batch where dp divides it, else whole.
    other = {"pending": jax.ShapeDtypeStruct((2, 7), jnp.int32), "odd": jax.ShapeDtypeStruct((3, 7), jnp.int32)}
    got = S.state_shardings(mesh, other)
    assert got["pending"].shard_shape((2, 7)) == (1, 7) and got["odd"].shard_shape((3, 7)) == (3, 7)


def test_host_room_reads_meminfo(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   "
                                      "12000000 kB\nCached: 5 kB\n")
    assert S.host_room(str(tmp_path / "meminfo")) == (12000000 * 1024, 24000000 * 1024)
    (tmp_path / "old").write_text("MemTotal: 24000000 kB\nMemFree: 100 kB\n")     # no MemAvailable: unknown
    assert S.host_room(str(tmp_path / "old")) is None
    assert S.host_room(str(tmp_path / "missing")) is None


def test_room_problem_on_cpu_devices_weighs_the_whole_state_against_the_host(target, monkeypatch):
    """CPU devices report no pool: every device's share together (they share the host's memory) against the host's
    available memory, so that a cache too large for the host is refused in one line instead of the process being
    killed by the kernel."""
    mesh = S.make_mesh(2, 2)
    cfg = S.shard_target(target, mesh).cfg
    abstract = jax.eval_shape(lambda: init_state(cfg, 2, 40))
    state = S.state_maker(mesh, lambda: init_state(cfg, 2, 40))()
    held = sum(s.data.nbytes for x in jax.tree_util.tree_leaves(state) for s in x.addressable_shards)
    assert S.device_room(list(mesh.devices.flat)) is None
    monkeypatch.setattr(S, "host_room", lambda: (held, 2**31))
    assert S.room_problem(abstract, mesh, "the state") is None        # exactly enough
    monkeypatch.setattr(S, "host_room", lambda: (held - 1, 2**31))
    problem = S.room_problem(abstract, mesh, "the state")
    assert problem == (f"the state needs {held / 2**30:.2f} GiB, but {(held - 1) / 2**30:.2f} GiB of the host's "
                       "2.00 GiB of memory are available"), problem
    monkeypatch.setattr(S, "host_room", lambda: None)               # not Linux: unknown, nothing refused
    assert S.room_problem(abstract, mesh, "the state") is None


def test_claim_device_memory_sets_a_fraction_only_where_none_is_set(monkeypatch):
    import os
    new, old = S.FRACTION_VARS
    for v in S.FRACTION_VARS:     # unset for this test and restored after it (claim_device_memory sets one)
        monkeypatch.setenv(v, "")
        monkeypatch.delenv(v)
    S.claim_device_memory()
    assert os.environ[new] == S.MEM_FRACTION and old not in os.environ
    monkeypatch.setenv(new, "0.5")
    S.claim_device_memory()
    assert os.environ[new] == "0.5"
    monkeypatch.delenv(new)
    monkeypatch.setenv(old, "0.7")       # the deprecated name: both set would stop the GPU client from starting
    S.claim_device_memory()
    assert new not in os.environ and os.environ[old] == "0.7"


@pytest.mark.parametrize("module,argv", [
    ("jaxspec.generate", ["--method", "ar", "--max-new-tokens", "2"]),
    ("bench.rounds", ["--config", "tiny", "--phases", "ar"]),
    ("bench.harness", ["--config", "tiny", "--out", "{tmp}/h.json"]),
    ("bench.tp", ["--config", "tiny", "--tp", "2"]),
    ("convert.__main__", ["target", "jaxspec/demo/target", "{tmp}/converted"]),
    ("jaxspec.train", ["eval", "--target", "jaxspec/demo/target", "--draft", "jaxspec/demo/drafter", "--text",
                       "README.md", "--out", "{tmp}/eval.json"]),
])
def test_the_clis_claim_device_memory_before_the_first_device_use(module, argv, tmp_path):
    """The fraction only counts if it is set before JAX's backends start: each CLI, in a fresh process without a
    fraction in its environment, has set it by the time a device is first asked for (the backends' start is
    replaced by a probe that prints the variable and ends the process)."""
    import os
    import subprocess
    import sys
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    probe = ("import importlib, os, sys\nfrom jax._src import xla_bridge\n"
             "def first_use(*a, **k):\n    print('FRACTION', os.environ.get('XLA_CLIENT_MEM_FRACTION'), flush=True)\n"
             "    os._exit(0)\n"
             f"xla_bridge.backends = first_use\nimportlib.import_module({module!r}).main({argv!r})\n")
    env = {k: v for k, v in os.environ.items() if k not in S.FRACTION_VARS}
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert f"FRACTION {S.MEM_FRACTION}" in run.stdout, (run.stdout, run.stderr[-2000:])


@pytest.mark.parametrize("op", ["gdn_commit", "conv_commit"])
def test_commit_kernels_run_per_shard(target_dk16, monkeypatch, op):
    """The commit's kernels (interpreted) under tensor + data parallelism: gdn_commit traced on per-shard states (1
    of the 2 sequences, a quarter of the value heads) for an oracle DFlash chain's commits (AR's path of one node
    stays on the reference), conv_commit on per-shard histories (1 sequence, a quarter of the channels: whole
    key-head groups) for AR's and the chain's; the tokens equal the unsharded model's greedy AR without them."""
    from oracle import OracleChain, reference
    api = importlib.import_module(f"pallas_kernels.{op}.api")
    kernel_module = importlib.import_module(f"pallas_kernels.{op}.pallas_triton")
    target = target_dk16
    rs = np.random.RandomState(6)
    prompts = [rs.randint(0, 509, size=n).tolist() for n in (7, 12)]
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    ar = Engine(target).generate(prompts, 10).tokens
    shapes, fn = [], getattr(kernel_module, op)
    monkeypatch.setattr(kernel_module, op, lambda xs, *a, **kw: shapes.append(xs[0].shape) or fn(xs, *a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    mesh = S.make_mesh(4, 2)
    sharded = S.shard_target(target, mesh)
    assert Engine(sharded, mesh=mesh).generate(prompts, 10).tokens == ar
    chain = Engine(sharded, OracleChain(4, 509, ref=reference(prompts, ar, 4)), mesh=mesh)
    assert chain.generate(prompts, 10, seed=1).tokens == ar
    cfg = target.cfg
    if op == "gdn_commit":
        assert shapes and {s[:2] for s in shapes} == {(1, cfg.linear_num_value_heads // 4)}, shapes
    else:
        assert shapes and {(s[0], s[2]) for s in shapes} == {(1, cfg.conv_dim // 4)}, shapes
