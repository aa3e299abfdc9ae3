"""One engine for every decoding method: verify(tree) -> accept -> commit (DESIGN.md section 2).

A speculator proposes a tree whose root is the pending token (the previous bonus, not yet processed
by the target); plain AR proposes the root alone. The whole round is one compiled program, and
`Engine.run` executes many rounds inside one `lax.while_loop`, returning to the host only between
segments (for streaming output), never per token.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import time
from collections.abc import Iterable
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec import tree as trees
from jaxspec.config import ConfigError
from jaxspec.model import Qwen35, State, commit, init_state
from jaxspec.sampling import Sampling, categorical, choose, log_probs, seed_problem
from jaxspec.sharding import check_laid_out, check_mesh, constrain_state, dp_degree, room_problem, state_maker
from pallas_kernels.dispatch import LOOP_GRAPHS_MODES, check_flags


def accept(tree: trees.Tree, tokens, target_choice):
    """Walk from the root along the target's own choice: at node `cur` go to the child whose token is
    target_choice[cur]; stop when there is none. Lossless for greedy and for independent per-node
    samples. Returns path [B,P] (P = tree.longest_path; valid for k < n; 0 beyond), n [B] >= 1, bonus [B].

    Computed without a loop (a sequential walk costs a kernel launch per depth on the GPU): a node is
    on the path iff it and every ancestor match their parent's choice, taking the first matching
    sibling where several would (never the case in DDTree trees or chains)."""
    b, nn = tokens.shape
    idx = jnp.arange(nn, dtype=jnp.int32)
    match = (tokens == jnp.take_along_axis(target_choice, jnp.maximum(tree.parent, 0), 1)) & (tree.parent >= 0)
    siblings = tree.parent[:, :, None] == tree.parent[:, None, :]
    shadowed = (siblings & (idx[None, None, :] < idx[None, :, None]) & match[:, None, :]).any(-1)
    ok = (match & ~shadowed) | (idx == 0)[None]
    on = ~(tree.anc & ~ok[:, None, :]).any(-1)                                       # [B, N]
    n = on.sum(1).astype(jnp.int32)
    last = jnp.argmax(jnp.where(on, tree.depth, -1), 1)
    rows = jnp.arange(b)[:, None]
    p = tree.longest_path
    path = jnp.zeros((b, p), jnp.int32).at[rows, jnp.where(on, tree.depth, p)].set(
        jnp.broadcast_to(idx, (b, nn)), mode="drop")
    bonus = jnp.take_along_axis(target_choice, last[:, None], 1)[:, 0]
    return path, n, bonus


def accept_rejection(key, tokens, logq, logits, s: Sampling):
    """Speculative rejection sampling on a chain (Leviathan et al. 2023; Chen et al. 2023): draft
    d_j ~ q_j is kept while u_j < p_j(d_j) / q_j(d_j), p the target's transformed distribution at the
    parent; at the first rejection the bonus is drawn from norm(max(p - q, 0)), after a fully accepted
    chain from p at the last node. Output distribution = sampling from p alone."""
    b, nn = tokens.shape
    logp = log_probs(logits, s)                                                    # [B, N, V]
    d = tokens[:, 1:]
    lp = jnp.take_along_axis(logp[:, :-1], d[..., None], -1)[..., 0]              # p_{j-1}(d_j)
    lq = jnp.take_along_axis(logq[:, 1:], d[..., None], -1)[..., 0]               # q_j(d_j)
    k_u, k_b = jax.random.split(key)
    u = jax.random.uniform(k_u, lp.shape)
    ok = jnp.log(u) < lp - lq
    a = jnp.cumprod(ok, 1).sum(1).astype(jnp.int32)                                # accepted drafts
    n = a + 1
    p_a = jnp.exp(jnp.take_along_axis(logp, a[:, None, None], 1)[:, 0])
    q_next = jnp.exp(jnp.take_along_axis(logq, jnp.minimum(a + 1, nn - 1)[:, None, None], 1)[:, 0])
    resid = jnp.where((a < nn - 1)[:, None], jnp.maximum(p_a - q_next, 0.0), p_a)
    resid = jnp.where(resid.sum(-1, keepdims=True) > 0, resid, p_a)
    bonus = categorical(k_b, jnp.log(resid))
    path = jnp.broadcast_to(jnp.arange(nn, dtype=jnp.int32), (b, nn))
    return path, n, bonus


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Proposal:
    """A tree to verify. tokens [B, N] with the pending token at the root; logq [B, N, V]: the
    drafter's (sampling-transformed) log-probabilities of each node's token given its parent's prefix,
    row i for node i, or None when the drafter is deterministic."""

    tokens: jax.Array
    tree: trees.Tree
    logq: jax.Array | None = None


class Speculator:
    """What a drafter plugs into the engine. `params` is a pytree of device arrays passed to the
    compiled round as an argument (never captured as a constant); `draft` is the drafter's state."""

    name = "speculator"
    taps: tuple[int, ...] = ()   # target layers whose outputs the drafter reads
    tree_size = 1                # nodes per verified tree (static)
    params: Any = ()
    # (what, argument, jaxspec.sharding function) that lays `params` out on a mesh, for the engine's error when
    # they are not (`check_laid_out`); None for a speculator without params.
    layout: tuple[str, str, str] | None = None
    # `target_cfg` (set by a speculator built for one target) and the fields of it that must match the model's:
    # `Engine` refuses a model that differs in any of them.
    target_cfg = None
    target_fields: tuple[str, ...] = ("vocab_size", "hidden_size", "num_layers")

    def init(self, batch: int, max_len: int):
        return ()

    def start(self, params, model, draft, taps, n, tokens):
        """After a prefill piece: taps [B, P, len(taps), D] of which the first n[b] rows are committed;
        tokens [B, P] the piece's tokens (a drafter that pairs row t with token t+1, like MTP, needs them)."""
        return draft

    def propose(self, params, model, draft, pending, key, sampling: Sampling) -> tuple[Proposal, Any]:
        """The tree to verify, and the drafter state (which may remember what it proposed)."""
        raise NotImplementedError

    def update(self, params, model, draft, taps, path, n):
        """After commit: taps of the verified nodes; path[:, :n] is the accepted path."""
        return draft


class AR(Speculator):
    """Plain autoregressive decoding: the root alone.

    With rows > 1 the step runs as a verify-sized tile: the root and rows - 1 copies of it, each copy a root of its
    own (`trees.forest`), so never on an accepted path and never committed. The target's products then see as many
    rows as a verify's. On the H200 a row's product has the same bits padded to M rows as inside an M-row product,
    and never as a 1-row product; under BF16_BF16_F32_X6 the 1-row product even has a bf16 product's error
    (bench/results/2026-12-03-h200-s35/, `rows/`). The tokens are AR's either way; only the arithmetic changes."""

    name = "ar"

    def __init__(self, rows: int = 1):
        rows = int_arg(rows, "AR rows")
        if rows < 1:
            raise ValueError(f"AR rows {rows}: must be >= 1")
        self.rows = self.tree_size = rows

    def propose(self, params, model, draft, pending, key, sampling):
        b = pending.shape[0]
        if self.rows == 1:
            return Proposal(pending[:, None], trees.chain(b, 1)), draft
        tokens = jnp.broadcast_to(pending[:, None], (b, self.rows))
        return Proposal(tokens, trees.forest(b, self.rows)), draft


# XLA's default command-buffer (CUDA graph) kinds in jax 0.11.2's XLA, plus WHILE and CONDITIONAL: a call of the
# round loop then runs as one graph, without a return to the host for each round's loop predicate.
LOOP_GRAPH_COMMANDS = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
# XLA's conversion pass counts a WHILE as one thunk (not its body) against xla_gpu_graph_min_graph_size (default 5):
# a loop whose whole body converts sits in a sequence of ~2 thunks and was left out of any graph. Hence 1. Timed in
# one lease on the H200 at 1K context, real 27B shape, 100 rounds a call: the AR loop 13.54 ms a round before,
# 13.30 with this and the fused GDN one-token kernel (bench/results/2026-12-04-h200-s39/).
LOOP_GRAPH_OPTIONS = {"xla_gpu_enable_command_buffer": LOOP_GRAPH_COMMANDS, "xla_gpu_graph_min_graph_size": 1}


# XLA splits K in some of a 64-row verify's products (the GDN in_proj in two, f32 partials summed again by two fusions
# a layer: bench/results/2026-12-04-h200-s46/call2-round-trace/). Forced to one split everywhere, on the H200 at 1K,
# real 27B shape, means of two: the DDTree(63) round 20.40 -> 20.17 ms, the DFlash round (16 rows) 17.36 -> 17.41,
# the AR step 13.33 -> 14.13 (bench/results/2026-12-05-h200-s54/force-split-k/). Hence only loops that verify
# SPLIT_K_NODES or more nodes a round get it: on an H100, in one lease, means of two, the DDTree(63) round
# 27.07 -> 26.83 ms with it in that loop alone (bench/results/2026-12-05-h100-s55/split-k-ab/). Nodes per sequence,
# not product rows: the batch is not known when the loop's jit is made (only batch 1 was timed).
SPLIT_K_NODES = 64
SPLIT_K_OPTIONS = {"xla_gpu_experimental_force_split_k": 1}

# XLA plans the round loop's memory against 95% of the device's pool by default (its slop factor); near that limit
# it rematerializes, and the loop gets longer. On an H100 (53.8 GB of weights, a 137,292-slot cache), the DDTree(63)
# round at 128K context: 39.76 ms at the default (189 instructions rematerialized), 37.04 at 100, 36.99 at 120; at
# 1K context with the same cache 28.95 at 95 against 25.91 with these options, one lease
# (bench/results/2026-12-06-h100-s59/). The loops ran within the pool at 100 and at 120; the AR and DFlash loops at
# 128K did not move. Not applied where XLA_FLAGS sets the factor.
MEMORY_OPTIONS = {"xla_gpu_memory_limit_slop_factor": 100}


def loop_compiler_options(spec: Speculator) -> dict:
    """XLA options for the engine's round loop, from JAXSPEC_LOOP_GRAPHS: `all` (default: every method's loop
    compiles with WHILE / CONDITIONAL command buffers), `ar` (the AR loop alone) or `none`. Only a GPU compile reads
    them. Timed on the H200 at 1K context, real 27B shape: the AR loop 15.51 -> 14.95 ms a round with `ar` against
    `none` (bench/results/2026-12-03-h200-s31/loop-graphs/); in one lease, 10 rounds a call, the DFlash round
    18.15 -> 17.96 ms and DDTree(63) 23.16 -> 22.83 ms with `all` against `ar` (17.49 / 22.38 with calls queued,
    bench/results/2026-12-04-h200-s40/loops/). At XLA's default minimum graph size (5, before session 39) `all` had
    made those two loops 1.4 / 1.1 ms longer (bench/results/2026-12-02-h200-s23-peel-graphs-eval/). A loop that
    verifies SPLIT_K_NODES or more nodes a round also gets SPLIT_K_OPTIONS, whatever the variable says, and every
    loop gets MEMORY_OPTIONS unless XLA_FLAGS sets that factor."""
    mode = os.environ.get("JAXSPEC_LOOP_GRAPHS") or "all"
    if mode not in LOOP_GRAPHS_MODES:
        raise ValueError(f"JAXSPEC_LOOP_GRAPHS={mode!r}: expected one of {', '.join(LOOP_GRAPHS_MODES)}")
    on = mode == "all" or (mode == "ar" and isinstance(spec, AR))
    split = SPLIT_K_OPTIONS if spec.tree_size >= SPLIT_K_NODES else {}
    memory = {} if "xla_gpu_memory_limit_slop_factor" in os.environ.get("XLA_FLAGS", "") else MEMORY_OPTIONS
    return (LOOP_GRAPH_OPTIONS if on else {}) | split | memory


class NoRoom(ValueError):
    """The device's pool cannot hold the KV cache and GDN state a call asks for (refused before allocating)."""


def int_arg(value, name: str, error: type[Exception] = ValueError) -> int:
    """`value` (a Python or numpy integer) as an int; a float (2.5, or 2.0), a bool or anything else is an `error`
    naming `name`, never silently truncated."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise error(f"{name} must be an integer, got {value!r}")


def check_prompts(prompts, vocab_size: int) -> list[np.ndarray]:
    """The prompts as int32 arrays, each checked: a non-empty list of token-id lists (or a 2-D array), every id an
    integer in [0, vocab_size). The model clips ids into range (DDTree's invalid nodes are -1), so an id outside it
    would silently decode as another token."""
    what = "prompts: a non-empty list of token-id lists"
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__") or len(prompts) == 0:
        raise ValueError(f"{what}, got {prompts!r}"[:200])
    out = []
    for i, pr in enumerate(prompts):
        if isinstance(pr, (str, bytes)) or not hasattr(pr, "__len__"):
            raise ValueError(f"{what}; prompt {i} is {pr!r}"[:200])
        if len(pr) == 0:
            raise ValueError(f"every prompt needs at least one token; prompt {i} is empty")
        a = np.asarray(pr)
        if a.ndim != 1:
            raise ValueError(f"{what}; prompt {i} has shape {a.shape}")
        integer = lambda t: isinstance(t, (int, np.integer)) and not isinstance(t, bool)
        if a.dtype.kind not in "iu":    # floats, bools, or ids beyond int64: find the first bad one
            a = np.asarray(pr, object)
            j = next(j for j, t in enumerate(a) if not integer(t) or not 0 <= t < vocab_size)
        else:
            j = next(iter(np.flatnonzero((a < 0) | (a >= vocab_size))), None)
        if j is not None:
            t = a[j]
            why = f"is outside the vocabulary [0, {vocab_size})" if integer(t) else "is not an integer"
            t = int(t) if integer(t) else float(t) if isinstance(t, np.floating) else t
            raise ValueError(f"prompt {i}, position {j}: token id {t!r} {why}")
        out.append(a.astype(np.int32))
    return out


def default_max_len(need: int) -> int:
    """The cache length for a call that needs `need` slots: rounded up to one of 8 lengths per power of two (at
    least a multiple of 16), so calls of nearby lengths share one compile of the prefill and round loop; from 128
    slots up at most 1/8 more are allocated (the jnp attention reads every slot)."""
    need = int(need)
    step = 1 << max(4, need.bit_length() - 4)
    return -(-need // step) * step


def context_problem(longest: int, max_new: int, max_len: int | None, tree_size: int, bound: int,
                    new_name: str = "max_new_tokens", len_name: str = "max_len") -> str | None:
    """Why a request does not fit, or None: the longest prompt + `max_new` tokens past the model's context limit
    `bound` (max_position_embeddings; 0: none), or + the verified tree past the cache's `max_len` (None: the
    default, which fits). The names are the arguments' (the CLI passes its flags')."""
    if bound and longest + max_new > bound:
        return (f"prompt ({longest} tokens) + {new_name} ({max_new}) exceeds the model's context limit "
                f"(max_position_embeddings {bound} in its config.json); shorten the prompt or lower {new_name}")
    if max_len is not None and longest + max_new + tree_size > max_len:
        return (f"prompt ({longest} tokens) + {new_name} ({max_new}) + tree ({tree_size}) exceeds the context of "
                f"{len_name} {max_len} tokens; raise {len_name} or lower {new_name}")
    return None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Decoding:
    """Everything that changes from round to round, on the device."""

    state: State
    draft: Any
    pending: jax.Array     # [B] the bonus token the target has not processed yet
    out: jax.Array         # [B, max_len] generated tokens (max_len >= max_new + tree_size)
    n_out: jax.Array       # [B]
    done: jax.Array        # [B] bool
    key: jax.Array
    hist: jax.Array        # [B, tree_size + 1] accepted-length histogram (tokens emitted per round)
    rounds: jax.Array      # [B] rounds run while not done


@dataclasses.dataclass
class Result:
    tokens: list[list[int]]
    prefill_s: float
    decode_s: float
    rounds: np.ndarray
    hist: np.ndarray       # [tree_size + 1] rounds by tokens emitted, summed over the batch
    final: Decoding        # the device state after the last round (drafter state included)

    @property
    def n_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per verify round (the acceptance length)."""
        r = int(self.hist.sum())
        return float((self.hist * np.arange(len(self.hist))).sum() / r) if r else 0.0


# Prompt tokens per compiled prefill piece (`Engine(prefill_chunk=)`, generate's --prefill-chunk): the prompt runs as
# pieces of this many tokens, then its tail in powers of two (`prefill_pieces`). An 8K prompt on the H200 took
# 1128.49 ms in pieces of 256 and 938.13 in pieces of 1024 (bench/results/2026-12-06-h200-s63/): each piece reads
# every weight once and its prefix through the tree kernel. 256 was the default until session 66.
PREFILL_CHUNK = 1024
# A tail piece is rounded up to a power of two when that pads at most this many tokens; else it is the largest power
# of two that fits and the rest follows. A piece reads every weight once, which on an H100 / H200 takes about as
# long as ~150 tokens of its products (matmul rate / memory bandwidth): more padding than that costs more than
# another call.
TAIL_PAD = 128


def prefill_pieces(longest: int, chunk: int) -> list[int]:
    """The lengths of the prefill's pieces for a prompt of `longest` tokens: `chunk` while the rest is that long,
    then powers of two >= 16 (at most `chunk`), the last one padding at most TAIL_PAD tokens unless it is 16. Each
    length compiles once; all are powers of two or `chunk`, so prompts of any length share a few compiles."""
    sizes, rest = [], longest
    while rest > 0:
        up = max(16, 1 << (rest - 1).bit_length())
        if rest >= chunk:
            p = chunk
        elif up - rest <= TAIL_PAD or up == 16:
            p = min(up, chunk)
        else:
            p = 1 << (rest.bit_length() - 1)        # the largest power of two <= rest
        sizes.append(p)
        rest -= p
    return sizes


class Engine:
    """Holds the compiled prefill and round functions for one model, speculator and sampling.

    stop_tokens: the token ids that end a sequence (emitted, then nothing after). None by default (`()`; `None` is
    taken as `()`): the model's EOS ids (`model.cfg.eos_token_ids`, from config.json / generation_config.json) are
    not used unless passed here, e.g. `stop_tokens=model.cfg.eos_token_ids` (as the `jaxspec.generate` CLI does)."""

    def __init__(self, model: Qwen35, speculator=None, sampling: Sampling = Sampling(), *,
                 stop_tokens=(), prefill_chunk: int = PREFILL_CHUNK, mesh=None):
        """mesh: the (data, model) mesh that `model` and the speculator's params were sharded on
        (jaxspec/sharding.py); the state is created and kept in its shardings."""
        check_flags()       # a misspelt JAXSPEC_* flag (or one since removed) would choose nothing
        self.cfg = model.cfg
        if mesh is not None:    # a mesh jaxspec can shard on, and the model laid out on it (else errors deep in jit)
            check_laid_out(model, check_mesh(mesh))
        self.mesh = mesh
        self.spec = speculator or AR()
        want = self.spec.target_cfg         # the target config a DFlash / MTP was checked against
        bad = [f"{f} {getattr(want, f)} vs {getattr(self.cfg, f)}" for f in self.spec.target_fields
               if want is not None and getattr(want, f) != getattr(self.cfg, f)]
        if bad:
            raise ConfigError(f"the {self.spec.name} speculator was built for another target than this model "
                              f"({'; '.join(bad)})")
        # The speculator's params laid out on the mesh too: unsharded, they fail in the first generate (on one
        # device: incompatible devices; with kv heads fewer than the degree: an IndivisibleError), or, left
        # uncommitted, are resharded from one device on every call.
        if mesh is not None and self.spec.layout is not None:
            what, arg, fix = self.spec.layout
            check_laid_out(self.spec.params, mesh, what, fix, arg=arg, load=False)
        self.graphdef, target_params = nnx.split(model)
        # The target's weights as a flat list of arrays: every compiled call flattens its arguments in Python, and
        # an nnx.State of a 64-layer model (~600 arrays) takes milliseconds to flatten, a list a fraction of that.
        leaves, self._target_def = jax.tree.flatten(target_params)
        self.params = (leaves, self.spec.params)
        self.sampling = sampling
        if stop_tokens is None:
            stop_tokens = ()
        if not isinstance(stop_tokens, Iterable) or isinstance(stop_tokens, (str, bytes)):
            raise ValueError(f"stop_tokens must be a collection of token ids, got {stop_tokens!r}")
        stop = sorted(set(int_arg(t, "stop_tokens: token id") for t in stop_tokens))
        outside = [t for t in stop if not 0 <= t < self.cfg.vocab_size]
        if outside:
            raise ValueError(f"stop_tokens {outside} are outside the vocabulary [0, {self.cfg.vocab_size})")
        self.stop = jnp.asarray(stop or [-1], jnp.int32)
        self.prefill_chunk = int_arg(prefill_chunk, "prefill_chunk")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        self._prefill = self._in_mesh(jax.jit(self._prefill_piece, donate_argnums=(1, 2)))
        # max_new and max_rounds are traced: another --max-new-tokens or rounds per call reuses the loop's compile
        self._run = self._in_mesh(jax.jit(self._run_rounds, donate_argnums=(1,),
                                          compiler_options=loop_compiler_options(self.spec) or None))
        # the first token's choice, compiled once (eager, top-p traced its threshold search on every call)
        self._choose = self._in_mesh(jax.jit(lambda key, logits: choose(key, logits, self.sampling)))
        self._makers = {}     # (batch, max_len) -> jitted makers of empty target and drafter states, their shapes

    def _in_mesh(self, fn):
        """fn traced and run with the mesh set (per-shard Pallas kernels read it while tracing)."""
        if self.mesh is None:
            return fn

        def run(*a):
            with jax.set_mesh(self.mesh):
                return fn(*a)
        run.lower = lambda *a: self._lower(fn, *a)
        return run

    def _lower(self, fn, *a):
        with jax.set_mesh(self.mesh):
            return fn.lower(*a)

    # -- compiled pieces -------------------------------------------------------------------------

    def _model(self, params) -> Qwen35:
        return nnx.merge(self.graphdef, jax.tree.unflatten(self._target_def, params[0]))

    def _prefill_piece(self, params, state: State, draft, tokens, n):
        """Commit one piece of the prompt: a chain of P tokens of which the first n[b] are real."""
        model = self._model(params)
        b, p = tokens.shape
        tr = trees.chain(b, p)
        idx = jnp.maximum(n - 1, 0)
        logits, taps, new, _ = model(tokens, state, tr, taps=self.spec.taps, logit_index=idx, commit_n=n)
        draft = self.spec.start(params[1], model, draft, taps, n, tokens)
        new, draft = constrain_state(self.mesh, (new, draft))
        return logits, new, draft

    def _round(self, params, d: Decoding, max_new) -> Decoding:
        model = self._model(params)
        key, k_draft, k_accept = jax.random.split(d.key, 3)
        prop, draft = self.spec.propose(params[1], model, d.draft, d.pending, k_draft, self.sampling)
        tokens, tr = prop.tokens, prop.tree
        logits, taps, state, pend = model(tokens, d.state, tr, taps=self.spec.taps)
        if prop.logq is not None and not self.sampling.greedy:
            path, n, bonus = accept_rejection(k_accept, tokens, prop.logq, logits, self.sampling)
        else:
            path, n, bonus = accept(tr, tokens, choose(k_accept, logits, self.sampling))
        n_commit = jnp.where(d.done, 0, n)  # finished sequences keep their state
        state = commit(state, pend, tr, path, n_commit)
        draft = self.spec.update(params[1], model, draft, taps, path, n_commit)
        # Emitted this round: the accepted drafts (path[1:n]) then the bonus.
        b, nn = path.shape
        k = jnp.arange(nn, dtype=jnp.int32)[None]
        path_tok = jnp.take_along_axis(tokens, jnp.roll(path, -1, 1), 1)
        emit = jnp.where(k < n[:, None] - 1, path_tok, bonus[:, None])
        valid = (k < n[:, None]) & ~d.done[:, None]
        is_stop = (emit[..., None] == self.stop).any(-1) & valid
        first_stop = jnp.where(is_stop.any(1), jnp.argmax(is_stop, 1) + 1, nn)
        count = jnp.minimum(jnp.minimum(n, first_stop), max_new - d.n_out)
        count = jnp.where(d.done, 0, count)
        rows = jnp.arange(b)[:, None]
        slots = jnp.where(k < count[:, None], d.n_out[:, None] + k, d.out.shape[1])
        out = d.out.at[rows, slots].set(emit, mode="drop")
        n_out = d.n_out + count
        room = state.length + self.spec.tree_size <= state.max_len
        done = d.done | is_stop.any(1) | (n_out >= max_new) | ~room
        hist = d.hist.at[jnp.arange(b), count].add(jnp.where(d.done, 0, 1))   # emitted: not past a stop or max_new
        state, draft = constrain_state(self.mesh, (state, draft))
        return Decoding(state, draft, jnp.where(d.done, d.pending, bonus), out, n_out, done, key, hist,
                        d.rounds + ~d.done)

    def _run_rounds(self, params, d: Decoding, max_new, max_rounds) -> Decoding:
        """Up to `max_rounds` rounds (int32 scalars or Python ints, traced) until every sequence is done."""
        def cond(c):
            i, d = c
            return (i < max_rounds) & ~d.done.all()

        def body(c):
            i, d = c
            return i + 1, self._round(params, d, max_new)

        return jax.lax.while_loop(cond, body, (0, d))[1]

    # -- host driver -----------------------------------------------------------------------------

    def _fresh_states(self, b: int, max_len: int):
        """Empty target and drafter states for b sequences of max_len slots, placed on the mesh if there is one;
        the makers compile once per (b, max_len), not once per generate call."""
        if (b, max_len) not in self._makers:
            makes = (lambda: init_state(self.cfg, b, max_len), lambda: self.spec.init(b, max_len))
            self._makers[b, max_len] = (tuple(state_maker(self.mesh, m) for m in makes),
                                        jax.eval_shape(lambda: tuple(m() for m in makes)))
        makers, abstract = self._makers[b, max_len]
        problem = room_problem(abstract, self.mesh, f"the KV cache and GDN state of {b} sequence(s) of max_len "
                                                    f"{max_len}")
        if problem:
            raise NoRoom(problem)
        return tuple(make() for make in makers)

    def prefill(self, prompts: list[list[int]], max_len: int, seed: int = 0):
        """The prompts through the target (and the speculator's context) in pieces of at most `prefill_chunk`
        tokens: (first token [B], target state, speculator state, key) for the round loop."""
        prompts = check_prompts(prompts, self.cfg.vocab_size)
        max_len = int_arg(max_len, "max_len")
        seed = int_arg(seed, "seed")
        if problem := seed_problem(seed, "seed"):
            raise ValueError(problem)
        b = len(prompts)
        lens = np.array([len(p) for p in prompts], np.int32)
        if lens.max() >= max_len:
            raise ValueError(f"prompt of {lens.max()} tokens does not fit the context of {max_len} tokens")
        # Pieces of prefill_chunk tokens, then the tail in powers of two (the lengths shorter prompts compile
        # anyway), not a whole piece of padding.
        sizes = prefill_pieces(int(lens.max()), self.prefill_chunk)
        starts = np.cumsum([0] + sizes[:-1]).tolist()
        toks = np.zeros((b, starts[-1] + sizes[-1]), np.int32)
        for i, pr in enumerate(prompts):
            toks[i, :len(pr)] = pr
        if b % dp_degree(self.mesh):
            raise ValueError(f"batch of {b} prompts is not a multiple of the data-parallel degree "
                             f"{dp_degree(self.mesh)}")
        state, draft = self._fresh_states(b, max_len)
        last = None
        for c, p in zip(starts, sizes):
            n = np.clip(lens - c, 0, p).astype(np.int32)
            logits, state, draft = self._prefill(self.params, state, draft, jnp.asarray(toks[:, c:c + p]),
                                                 jnp.asarray(n))
            has_last = jnp.asarray((lens - 1 >= c) & (lens - 1 < c + p))[:, None]
            last = logits if last is None else jnp.where(has_last, logits, last)
        key = jax.random.key(seed)
        key, k0 = jax.random.split(key)
        first = self._choose(k0, last)
        return first, state, draft, key

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, max_len: int | None = None,
                 seed: int = 0, rounds_per_call: int = 1 << 30,
                 on_tokens: Callable[[list[list[int]]], None] | None = None) -> Result:
        """Generate up to `max_new_tokens` per prompt; `on_tokens` receives the new tokens of each
        sequence after every segment of `rounds_per_call` rounds. `max_len` (the cache's slots) defaults to what
        the call needs, rounded up (`default_max_len`) so that prompts of nearby lengths share one compile."""
        if max_new_tokens is None:
            raise ValueError("max_new_tokens must be an integer, got None")
        max_new_tokens, max_len, rounds_per_call = (
            None if value is None else int_arg(value, name) for name, value in (
                ("max_new_tokens", max_new_tokens), ("max_len", max_len), ("rounds_per_call", rounds_per_call)))
        for name, value in (("max_new_tokens", max_new_tokens), ("max_len", max_len),
                            ("rounds_per_call", rounds_per_call)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        prompts = check_prompts(prompts, self.cfg.vocab_size)
        longest = max(len(p) for p in prompts)
        max_len = max_len or default_max_len(longest + max_new_tokens + self.spec.tree_size)
        if problem := context_problem(longest, max_new_tokens, max_len, self.spec.tree_size,
                                      self.cfg.max_position_embeddings):
            raise ValueError(problem)
        t0 = time.perf_counter()
        first, state, draft, key = self.prefill(prompts, max_len, seed)
        b = len(prompts)
        # max_len columns (>= max_new_tokens + the tree): the loop's shapes depend on the cache's bucket alone
        out = jnp.zeros((b, max_len), jnp.int32).at[:, 0].set(first)
        first_stop = (first[:, None] == self.stop).any(1)
        d = Decoding(state, draft, first, out, jnp.ones((b,), jnp.int32), first_stop | (max_new_tokens <= 1), key,
                     jnp.zeros((b, self.spec.tree_size + 1), jnp.int32), jnp.zeros((b,), jnp.int32))
        jax.block_until_ready(d)
        t1 = time.perf_counter()
        shown = np.ones(b, np.int64)
        if on_tokens:
            on_tokens([[int(t)] for t in np.asarray(first)])
        while not bool(d.done.all()):
            d = self._run(self.params, d, np.int32(max_new_tokens), np.int32(min(rounds_per_call, 1 << 30)))
            if on_tokens:
                n_out, out = np.asarray(d.n_out), np.asarray(d.out)
                on_tokens([out[i, shown[i]:n_out[i]].tolist() for i in range(b)])
                shown = n_out.astype(np.int64)
        n_out, out = np.asarray(d.n_out), np.asarray(d.out)
        t2 = time.perf_counter()
        return Result([out[i, :n_out[i]].tolist() for i in range(b)], t1 - t0, t2 - t1, np.asarray(d.rounds),
                      np.asarray(d.hist).sum(0), d)
