"""Plain AR through the engine: token-identical to transformers' greedy generate; batching, sampling,
stop tokens and bad input."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from convert.hf import load_target
from jaxspec.engine import Engine, accept, accept_rejection
from jaxspec import tree as trees
from jaxspec.sampling import Sampling, choose, log_probs
from kernel_tests import on_gpu
from oracle import OracleChain, reference


@pytest.fixture(scope="module")
def tiny(tiny_hf):
    path, hf = tiny_hf
    return hf, load_target(path, dtype="float32")


def _prompts():
    rs = np.random.RandomState(0)
    return [rs.randint(0, 512, size=n).tolist() for n in (5, 37, 80)]


def _hf_greedy(hf, prompt, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_matches_transformers_and_batch_matches_single(tiny):
    hf, model = tiny
    engine = Engine(model, prefill_chunk=32)  # several prefill pieces, sequences ending in different ones
    prompts = _prompts()
    batch = engine.generate(prompts, 24, rounds_per_call=5)
    for p, got in zip(prompts, batch.tokens):
        assert got == _hf_greedy(hf, p, 24)
        assert engine.generate([p], 24).tokens[0] == got
    assert batch.hist.tolist() == [0, int(batch.rounds.sum())]   # AR emits exactly one token per round
    assert batch.tau == 1.0


def test_prefill_pieces_cover_the_prompt_with_little_padding():
    """The prefill's piece lengths: whole pieces, then the tail in powers of two padding at most TAIL_PAD tokens
    (or up to a piece of 16), never longer than the piece, so every length is one of a few compiles."""
    from jaxspec.engine import TAIL_PAD, prefill_pieces
    assert prefill_pieces(8192, 1024) == [1024] * 8
    assert prefill_pieces(600, 1024) == [512, 128]       # not one piece of 1024 with 424 tokens of padding
    assert prefill_pieces(1000, 1024) == [1024] and prefill_pieces(5, 1024) == [16]
    for chunk in (1, 16, 256, 300, 1024):
        for n in range(1, 2100):
            sizes = prefill_pieces(n, chunk)
            assert n <= sum(sizes) <= n + max(TAIL_PAD, 15), (n, chunk, sizes)
            assert all(p == chunk or (p <= chunk and p & (p - 1) == 0) for p in sizes), (n, chunk, sizes)
            assert sizes == sorted(sizes, reverse=True), (n, chunk, sizes)


def test_prompt_in_uneven_pieces_matches_transformers(tiny):
    """A prompt of 300 tokens runs as pieces of 256 and 64 by default (prefill_pieces): greedy still decodes
    transformers' tokens, alone and beside a short prompt that ends in the first piece."""
    hf, model = tiny
    long, short = np.random.RandomState(1).randint(0, 512, size=300).tolist(), _prompts()[1]
    got = Engine(model).generate([long, short], 6).tokens
    assert got == [_hf_greedy(hf, long, 6), _hf_greedy(hf, short, 6)]


@pytest.mark.parametrize("layer_types", [["linear_attention"] * 2, ["full_attention"] * 2])
def test_models_of_one_layer_type(tmp_path, layer_types):
    """No full-attention layer means no KV cache and no length limit: generation still runs to max_new."""
    from conftest import make_causal_lm
    hf = make_causal_lm(tmp_path, num_hidden_layers=2, layer_types=layer_types)
    prompt = _prompts()[1]
    got = Engine(load_target(tmp_path, dtype="float32")).generate([prompt], 12, rounds_per_call=4).tokens[0]
    want = list(prompt)   # transformers' cache cannot generate without an attention layer: full forwards
    with torch.no_grad():
        for _ in range(12):
            want.append(int(hf(torch.tensor([want]), use_cache=False).logits[0, -1].argmax()))
    assert got == want[len(prompt):]


@pytest.mark.parametrize("rows", [5, 16])
def test_ar_as_a_tile_of_rows_decodes_transformers_tokens(tiny, rows):
    """AR(rows): the step as a verify-sized tile (the root and rows - 1 copies, each a root of its own). The copies
    are never accepted or committed: one token a round, transformers' greedy tokens, batched and ragged."""
    from jaxspec.engine import AR
    hf, model = tiny
    prompts = _prompts()
    got = Engine(model, AR(rows), prefill_chunk=32).generate(prompts, 24, rounds_per_call=5)
    assert [len(t) for t in got.tokens] == [24, 24, 24]
    for p, t in zip(prompts, got.tokens):
        assert t == _hf_greedy(hf, p, 24)
    assert got.hist.tolist()[2:] == [0] * (len(got.hist) - 2) and got.tau == 1.0
    with pytest.raises(ValueError, match="AR rows 0"):
        AR(0)


def test_forest_accepts_only_the_root():
    """trees.forest: with every copy's token equal to the target's choice, still only node 0 is on the path."""
    tr = trees.forest(2, 4)
    tokens = jnp.full((2, 4), 7, jnp.int32)
    path, n, bonus = accept(tr, tokens, jnp.full((2, 4), 7, jnp.int32))
    assert n.tolist() == [1, 1] and path.shape == (2, 1) and bonus.tolist() == [7, 7]


def test_stop_tokens_and_max_new_tokens(tiny):
    _, model = tiny
    prompts = _prompts()
    free = Engine(model).generate(prompts, 16).tokens
    assert all(len(t) == 16 for t in free)
    stop = free[1][6]
    stopped = Engine(model, stop_tokens=[stop]).generate(prompts, 16).tokens
    for f, s in zip(free, stopped):
        cut = f.index(stop) + 1 if stop in f else len(f)
        assert s == f[:cut]   # truncated right after the first stop token, which is kept
    assert Engine(model).generate(prompts[:1], 1).tokens[0] == free[0][:1]


def test_loop_graphs_flag(tiny, monkeypatch):
    """JAXSPEC_LOOP_GRAPHS picks which round loops compile with WHILE / CONDITIONAL command buffers (the options
    reach the round loop's jit; a CPU ignores them, so their tokens are checked on the GPU below); a bad value is
    refused naming the variable."""
    from jaxspec.dflash import DFlash
    from jaxspec.engine import AR, LOOP_GRAPH_COMMANDS, MEMORY_OPTIONS, loop_compiler_options
    memory = MEMORY_OPTIONS
    graphs = {"xla_gpu_enable_command_buffer": LOOP_GRAPH_COMMANDS, "xla_gpu_graph_min_graph_size": 1} | memory
    spec = object.__new__(DFlash)
    monkeypatch.delenv("JAXSPEC_LOOP_GRAPHS", raising=False)
    assert loop_compiler_options(AR()) == graphs and loop_compiler_options(spec) == graphs   # the default: `all`
    monkeypatch.setenv("JAXSPEC_LOOP_GRAPHS", "ar")
    assert loop_compiler_options(AR()) == graphs and loop_compiler_options(spec) == memory
    monkeypatch.setenv("JAXSPEC_LOOP_GRAPHS", "none")
    assert loop_compiler_options(AR()) == memory and loop_compiler_options(spec) == memory
    monkeypatch.setenv("JAXSPEC_LOOP_GRAPHS", "while")
    with pytest.raises(ValueError, match="JAXSPEC_LOOP_GRAPHS='while'"):
        loop_compiler_options(AR())
    _, model = tiny
    jit, given = jax.jit, []
    monkeypatch.setattr(jax, "jit", lambda *a, **kw: given.append(kw.get("compiler_options")) or jit(*a, **kw))
    for env, count in (("all", 1), ("none", 0)):     # the round loop's jit gets the options, no other jit
        monkeypatch.setenv("JAXSPEC_LOOP_GRAPHS", env)
        given.clear()
        engine = Engine(model)
        assert given and given.count(graphs) == count and all(o in (graphs, memory, None) for o in given), (env, given)
    monkeypatch.setattr(jax, "jit", jit)
    assert len(engine.generate(_prompts()[:2], 4).tokens) == 2     # a CPU compiles the loop with them (ignored)


def test_loops_plan_memory_to_the_pool(monkeypatch):
    """Every round loop compiles with XLA's memory-limit slop factor at 100 (its default 95 made XLA rematerialize
    near an H100's limit); a factor set in XLA_FLAGS is left to XLA, and the other options stay."""
    from jaxspec.engine import AR, MEMORY_OPTIONS, loop_compiler_options
    assert MEMORY_OPTIONS == {"xla_gpu_memory_limit_slop_factor": 100}
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    for env in ("all", "none"):
        monkeypatch.setenv("JAXSPEC_LOOP_GRAPHS", env)
        for rows in (1, 64):
            assert MEMORY_OPTIONS.items() <= loop_compiler_options(AR(rows)).items(), (env, rows)
    monkeypatch.setenv("JAXSPEC_LOOP_GRAPHS", "all")
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_memory_limit_slop_factor=95")
    options = loop_compiler_options(AR(64))
    assert "xla_gpu_memory_limit_slop_factor" not in options and "xla_gpu_enable_command_buffer" in options
    assert "xla_gpu_experimental_force_split_k" in options


@pytest.mark.parametrize("graphs_env", ["all", "none"])
def test_wide_trees_loop_with_one_k_split(tiny, monkeypatch, graphs_env):
    """A round loop that verifies SPLIT_K_NODES or more nodes compiles with XLA's split-K forced to one, under either
    graph setting; narrower trees, chains and AR keep XLA's choice. The options reach the loop's jit; a CPU compiles
    with them (ignored) and decodes AR's tokens."""
    from jaxspec.engine import AR, SPLIT_K_OPTIONS, SPLIT_K_NODES, loop_compiler_options
    monkeypatch.setenv("JAXSPEC_LOOP_GRAPHS", graphs_env)
    for rows in (1, 16, SPLIT_K_NODES - 1, SPLIT_K_NODES, 1025):
        options = loop_compiler_options(AR(rows))
        assert (SPLIT_K_OPTIONS.items() <= options.items()) == (rows >= SPLIT_K_NODES), (rows, options)
        assert ("xla_gpu_enable_command_buffer" in options) == (graphs_env == "all"), (rows, options)
    _, model = tiny
    jit, given = jax.jit, []
    monkeypatch.setattr(jax, "jit", lambda *a, **kw: given.append(kw.get("compiler_options")) or jit(*a, **kw))
    engine = Engine(model, AR(SPLIT_K_NODES))
    monkeypatch.setattr(jax, "jit", jit)
    assert [o for o in given if o] == [loop_compiler_options(AR(SPLIT_K_NODES))]
    prompts = _prompts()[:2]
    assert engine.generate(prompts, 6).tokens == Engine(model).generate(prompts, 6).tokens


@on_gpu
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_loop_graphs_on_gpu_decode_the_same_tokens(tiny, monkeypatch, temperature):
    """On a GPU, where XLA does build the WHILE / CONDITIONAL command buffers (`all`, the default), the AR loop and
    a speculative loop (an oracle chain drafter, so that rounds accept several tokens) decode exactly what they
    decode without them (`none`), greedy and seeded sampling, over calls of several rounds each
    (`JAX_PLATFORMS=cuda python -m pytest tests/test_engine.py -m gpu`)."""
    _, model = tiny
    prompts, n_new, block = _prompts(), 24, 4
    sampling = Sampling(temperature=temperature, top_k=20) if temperature else Sampling()
    out = {}
    for mode in ("none", "all"):
        monkeypatch.setenv("JAXSPEC_LOOP_GRAPHS", mode)
        ar = Engine(model, sampling=sampling).generate(prompts, n_new, seed=3, rounds_per_call=5)
        ref = None if temperature else reference(prompts, out["none"][0] if out else ar.tokens, block)
        chain = Engine(model, OracleChain(block, 512, ref=ref), sampling=sampling)
        spec = chain.generate(prompts, n_new, seed=3, rounds_per_call=5)
        out[mode] = ar.tokens, spec.tokens, spec.hist
    assert out["all"][:2] == out["none"][:2] and all(len(t) == n_new for t in out["all"][0] + out["all"][1])
    if not temperature:     # greedy: lossless against AR, with rounds that emitted 3 or more tokens
        assert out["all"][1] == out["all"][0] and (np.asarray(out["all"][2])[3:] > 0).any(), out["all"][2]


def test_default_max_len_shares_one_compile(tiny, monkeypatch):
    """Without max_len, prompts of nearby lengths get the same cache length (at most 1/8 more than they need), so
    the round loop is traced (and compiled) once, with the tokens of an exact max_len."""
    from jaxspec.engine import default_max_len
    assert [default_max_len(n) for n in (1, 16, 17, 82, 87, 1000, 1025, 131073)] == \
        [16, 16, 32, 96, 96, 1024, 1152, 147456]
    assert all(n <= default_max_len(n) <= max(n + 15, n * 9 // 8) for n in range(1, 5000))
    _, model = tiny
    traces = []
    run_rounds = Engine._run_rounds                                  # its body runs once per trace of the loop
    monkeypatch.setattr(Engine, "_run_rounds", lambda self, *a: traces.append(1) or run_rounds(self, *a))
    engine = Engine(model)
    longer = _prompts()[2]                                           # 80 tokens
    first = engine.generate([longer[:75]], 6)                        # needs 75 + 6 + 1 = 82 slots
    assert first.final.state.max_len == 96 and len(traces) == 1
    second = engine.generate([longer], 6)                            # needs 87
    assert second.final.state.max_len == 96 and len(traces) == 1
    engine.generate([longer], 6, max_len=160)                        # another cache length: a new trace
    assert len(traces) == 2
    assert second.tokens == Engine(model).generate([longer], 6, max_len=80 + 6 + 1).tokens
    # Other max_new_tokens and rounds per call in the same cache bucket: the same compiled loop (they are traced)
    traced = len(traces)                                             # the fresh Engine above traced its own
    third = engine.generate([longer[:70]], 12, rounds_per_call=3)    # needs 83: the 96 bucket again
    assert third.final.state.max_len == 96 and len(traces) == traced
    assert third.tokens[0][:6] == engine.generate([longer[:70]], 6, max_len=96).tokens[0]
    assert len(third.tokens[0]) == 12 and len(traces) == traced


def test_prefill_pieces_and_first_choice_compile_once(tiny, monkeypatch):
    """The prompt's last piece is only as long as its tail needs (a 257-token prompt: 256 + 16, not 256 + 256),
    and a sampled first token (top-p, whose threshold search is a loop) is chosen by one compiled function,
    not traced again on every call."""
    import jaxspec.engine as E
    _, model = tiny
    pieces, choices = [], []
    piece = Engine._prefill_piece
    monkeypatch.setattr(Engine, "_prefill_piece",
                        lambda self, params, state, draft, tokens, n: pieces.append(tokens.shape[1])
                        or piece(self, params, state, draft, tokens, n))
    choose = E.choose
    monkeypatch.setattr(E, "choose", lambda key, logits, s: choices.append(logits.shape) or choose(key, logits, s))
    engine = Engine(model, sampling=Sampling(temperature=0.7, top_p=0.9))
    prompt = np.random.RandomState(3).randint(0, 512, size=257).tolist()
    a = engine.generate([prompt], 4, seed=1)
    assert pieces == [256, 16], pieces
    traced = len(choices)          # the first token's choice and the round's, each traced once
    b = engine.generate([prompt], 4, seed=2)
    assert engine.generate([prompt], 4, seed=1).tokens == a.tokens       # seeded
    assert len(choices) == traced and pieces == [256, 16], (choices, pieces)
    assert all(0 <= t < 512 for t in a.tokens[0] + b.tokens[0])
    # Greedy with every prompt in pieces of 16: the same tokens as with the 256 + 16 pieces
    greedy = Engine(model).generate([prompt], 8).tokens
    assert greedy == Engine(model, prefill_chunk=16).generate([prompt], 8).tokens


def test_state_makers_compile_once_without_a_mesh():
    from jaxspec.sharding import state_maker
    calls = []
    make = state_maker(None, lambda: calls.append(1) or {"s": jnp.zeros((2, 3)), "n": jnp.zeros((2,), jnp.int32)})
    first, second = make(), make()
    assert len(calls) == 1 and first["s"].shape == (2, 3) and second["n"].dtype == jnp.int32


def test_a_cache_beyond_the_devices_free_memory_is_refused_before_allocation(tiny, monkeypatch):
    """Where the device reports its pool (a GPU), a cache that cannot fit in its free bytes is refused with the
    sizes, before anything is allocated (an allocation that fails deep in a compiled call can stall for minutes:
    bench/results/2026-12-05-h100-s57/table-3-contexts-oom/); one that just fits runs."""
    from jaxspec import sharding as S
    from jaxspec.model import init_state
    _, model = tiny
    engine = Engine(model)
    need = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(
        jax.eval_shape(lambda: (init_state(model.cfg, 1, 64), engine.spec.init(1, 64)))))
    monkeypatch.setattr(S, "device_room", lambda devices: (need - 1, 10 * need))
    with pytest.raises(ValueError, match=f"state of 1 sequence\\(s\\) of max_len 64 needs {need / 2**30:.2f} GiB"):
        engine.generate([_prompts()[0]], 4, max_len=64)
    monkeypatch.setattr(S, "device_room", lambda devices: (need, 10 * need))
    assert len(engine.generate([_prompts()[0]], 4, max_len=64).tokens[0]) == 4


def test_sampling_is_seeded_and_valid(tiny):
    _, model = tiny
    engine = Engine(model, sampling=Sampling(temperature=1.0, top_k=20, top_p=0.9))
    a = engine.generate(_prompts(), 12, seed=1).tokens
    assert a == engine.generate(_prompts(), 12, seed=1).tokens
    assert a != engine.generate(_prompts(), 12, seed=2).tokens
    assert all(0 <= t < model.cfg.vocab_size for row in a for t in row)


def test_log_probs_cuts():
    logits = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept = lambda s: np.isfinite(np.asarray(log_probs(logits, s)))[0].tolist()
    assert kept(Sampling(1.0, top_k=2)) == [True, True, False, False, False]
    assert kept(Sampling(1.0, top_p=0.6)) == [True, True, False, False, False]
    assert kept(Sampling(1.0, top_p=0.5)) == [True, False, False, False, False]
    assert kept(Sampling(1.0, top_p=0.86)) == [True, True, True, True, False]
    np.testing.assert_allclose(np.exp(log_probs(logits, Sampling(1.0, top_k=2))[0, :2]), [5 / 7, 2 / 7], rtol=1e-6)
    # Empirical frequencies of the sampler follow the truncated distribution.
    draws = choose(jax.random.key(0), jnp.broadcast_to(logits, (20000, 5)), Sampling(1.0, top_k=3))
    freq = np.bincount(np.asarray(draws), minlength=5) / 20000
    np.testing.assert_allclose(freq, [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0], atol=0.015)


@pytest.mark.parametrize("kw", [dict(temperature=-1.0), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_sampling_parameters(kw):
    flag = "--" + next(iter(kw)).replace("_", "-")
    with pytest.raises(ValueError, match=flag):
        Sampling(**kw)


def test_bad_lengths(tiny):
    _, model = tiny
    engine = Engine(model)
    with pytest.raises(ValueError, match="exceeds the context"):
        engine.generate([[1] * 50], 20, max_len=60)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([[1, 2]], 0)
    for kw in ({"max_len": 0}, {"max_len": -5}, {"rounds_per_call": 0}):   # 0 rounds a call looped forever
        with pytest.raises(ValueError, match=f"{next(iter(kw))} must be >= 1"):
            engine.generate([[1, 2]], 4, **kw)
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[1], []], 4)


def test_rejection_sampling_emits_the_targets_distribution():
    """accept_rejection on 200k rows of a 3-node chain whose drafts come from q (row 0 of logq zero, as DFlash and
    MTP pass it): the first emitted token (draft 1 if kept, else the bonus from the residual) is distributed as p0,
    and the second, where the round emits one, as p1. A residual built from the wrong node's q moves the first
    token's frequencies by ~0.15 (the lossless tests' chi-square, on a small sample, does not see it)."""
    b, v = 200_000, 4
    p0, p1 = np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.1, 0.1, 0.4, 0.4])
    q1, q2 = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.4, 0.3, 0.2, 0.1])
    k1, k2, ka = jax.random.split(jax.random.key(0), 3)
    d1 = jax.random.categorical(k1, jnp.log(q1), shape=(b,)).astype(jnp.int32)
    d2 = jax.random.categorical(k2, jnp.log(q2), shape=(b,)).astype(jnp.int32)
    tokens = jnp.stack([jnp.zeros(b, jnp.int32), d1, d2], 1)
    logq = jnp.broadcast_to(jnp.log(jnp.asarray(np.stack([np.ones(v), q1, q2]), jnp.float32)), (b, 3, v))
    logq = logq.at[:, 0].set(0.0)
    logits = jnp.broadcast_to(jnp.log(jnp.asarray(np.stack([p0, p1, p1]), jnp.float32)), (b, 3, v))
    path, n, bonus = map(np.asarray, accept_rejection(ka, tokens, logq, logits, Sampling(temperature=1.0)))
    d1, d2 = np.asarray(d1), np.asarray(d2)
    assert (path == np.arange(3)).all() and set(np.unique(n)) == {1, 2, 3}
    first = np.where(n >= 2, d1, bonus)
    np.testing.assert_allclose(np.bincount(first, minlength=v) / b, p0, atol=0.006)
    two = n >= 2
    second = np.where(n[two] >= 3, d2[two], bonus[two])
    np.testing.assert_allclose(np.bincount(second, minlength=v) / two.sum(), p1, atol=0.008)


def test_accept_walks_the_target_choice():
    # Tree: 0 -> {1, 2}; 1 -> {3}; 2 -> {4}; 4 -> {5}
    parent = jnp.array([[-1, 0, 0, 1, 2, 4]])
    tokens = jnp.array([[9, 7, 8, 3, 4, 5]])
    tr = trees.from_parents(parent)
    # Target picks 8 at the root (node 2), then 4 (node 4), then 6 (no such child): bonus 6.
    choice = jnp.array([[8, 0, 4, 0, 6, 0]])
    path, n, bonus = accept(tr, tokens, choice)
    assert int(n[0]) == 3 and path[0, :3].tolist() == [0, 2, 4] and int(bonus[0]) == 6
    path, n, bonus = accept(tr, tokens, jnp.array([[1, 0, 0, 0, 0, 0]]))
    assert int(n[0]) == 1 and int(bonus[0]) == 1


def test_accept_equals_a_sequential_walk():
    """The loop-free accept against the walk written out node by node, on random trees whose siblings
    may share tokens (then the walk takes the first)."""
    rs = np.random.RandomState(0)
    for i in range(90):
        n = (1, 6, 11)[i % 3]   # three shapes: one compile each
        parent = np.array([-1] + [rs.randint(0, i) for i in range(1, n)])
        tokens = rs.randint(0, 3, n)
        choice = rs.randint(0, 3, n)
        path, cur = [0], 0
        while True:
            kids = [j for j in range(n) if parent[j] == cur and tokens[j] == choice[cur]]
            if not kids:
                break
            cur = kids[0]
            path.append(cur)
        tr = trees.from_parents(jnp.asarray(parent[None]))
        if i % 2:               # a tree that knows its depth: the path comes as wide as its longest one
            tr = dataclasses.replace(tr, max_depth=int(tr.depth.max()))
        got_path, got_n, bonus = accept(tr, jnp.asarray(tokens[None]), jnp.asarray(choice[None]))
        assert got_path.shape == (1, n if i % 2 == 0 else int(tr.depth.max()) + 1)
        assert int(got_n[0]) == len(path)
        assert np.asarray(got_path[0, :len(path)]).tolist() == path
        assert int(bonus[0]) == choice[cur]
