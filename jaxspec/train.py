"""Training: DFlash drafters for a frozen target (the DFlash recipe, docs/history.md "Training a drafter"), and the
small demo pair.

    python -m jaxspec.train pair --out DIR [--time-budget-s 480] [--tiny] [--no-eval]
        corpus (the Python standard library's own .py source, some files held out) -> byte-level BPE
        tokenizer -> a small Qwen3.6-architecture target (GDN + gated attention) -> the drafter's data (the
        target teacher-forced over the corpus and its greedy generations, or either alone: --drafter-data) -> a
        DFlash drafter (block 16) -> HF export of both -> held-out evaluation (tau for DFlash and DDTree,
        token identity to AR, speedup) -> results.json, loss-curve PNGs, pair.tar.NN parts and pair.sha256.
    python -m jaxspec.train drafter --target DIR --text PATH... --out DIR [--data corpus|greedy] [--init DRAFTER]
        a DFlash drafter for an existing target (new, or continuing from --init): by default on the target
        teacher-forced over windows of the given text files, or on its greedy continuations of prompts cut
        from them; the target's features computed once and cached (--features cache, the default) or live,
        labels its own greedy predictions.
    python -m jaxspec.train eval --target DIR --draft DIR --text PATH... --out FILE.json
        tau of DFlash and DDTree (budgets 16, 32, 64), token identity to AR and tokens/s on held-out prompts.

The drafter recipe: the target (and its embedding and lm_head, which the drafter shares) is frozen; per
sequence, random anchor positions; each block [anchor, MASK x (B-1)] sits at positions anchor..anchor+B-1
and sees the target's tapped hidden states (fused by fc + hidden_norm) strictly before the anchor plus its
own block, with the per-layer causality and window of `jaxspec.drafter` (the very masks `Drafter.draft` uses
at inference; `block_masks` builds them for many blocks at once); cross-entropy on slots 1..B-1 weighted
by exp(-(k-1)/gamma), normalised by the weight sum. With corpus data (`FeatureCache`, `block_labels`) the
labels are the target's greedy predictions and slots after the text leaves the target's greedy path are
masked, so each label is the token the target itself would generate from that anchor. A small data set seen
many times overfits badly (the first demo drafter: held-out tau 1.15): `warn_epochs` flags it. AdamW (decoupled weight decay on matrices) with linear
warm-up, cosine decay and global-norm clipping, written here in plain jax. Data parallel over all devices
(the batch axis of a 1-D mesh). Orbax checkpoints every `--ckpt-every` steps, each with its own metadata; a rerun
with the same arguments resumes from the latest one that restores and continues with exactly the steps it would have
run. A rerun with other flags that shape the run (or another target or text) is refused, naming each; `drafter` with
another --steps trains on to that many. Ctrl-C (or SIGTERM, as from `timeout` or a preemption) stops training after
the current step, saves a checkpoint and exits with status 130 (143).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import sys
import sysconfig
import tarfile
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec import tree as trees
from jaxspec.config import FULL, LINEAR, ConfigError, TargetConfig
from jaxspec.drafter import Drafter, _visible
from jaxspec.drafter_config import DrafterConfig
from jaxspec.files import blocking_file, is_leftover, orbax_path_problem, write_atomic
from jaxspec.sharding import claim_device_memory
from jaxspec.provenance import git_info
from jaxspec.model import Qwen35, init_state
from pallas_kernels import dispatch

EOS_TOKEN, MASK_TOKEN = "<|endoftext|>", "<|mask|>"


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# AdamW, plain jax


@dataclasses.dataclass(frozen=True)
class OptConfig:
    lr: float = 1e-3
    warmup: int = 100          # steps of linear warm-up
    min_lr_frac: float = 0.1   # cosine decay to lr * min_lr_frac at `steps`
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.01
    clip: float = 1.0


def lr_at(step, steps: int, o: OptConfig):
    step = jnp.asarray(step, jnp.float32)
    warm = jnp.minimum((step + 1) / jnp.maximum(o.warmup, 1), 1.0)
    frac = jnp.clip((step - o.warmup) / jnp.maximum(steps - o.warmup, 1), 0.0, 1.0)
    cos = o.min_lr_frac + (1 - o.min_lr_frac) * 0.5 * (1 + jnp.cos(math.pi * frac))
    return o.lr * warm * cos


def adamw_init(params):
    zeros = lambda p: jnp.zeros(p.shape, jnp.float32)
    return {"m": jax.tree.map(zeros, params), "v": jax.tree.map(zeros, params)}


def adamw_update(params, grads, opt, step, steps: int, o: OptConfig):
    """One AdamW step with global-norm clipping. Returns (params, opt, grad_norm, lr)."""
    gnorm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads)))
    scale = jnp.minimum(1.0, o.clip / (gnorm + 1e-6))
    lr = lr_at(step, steps, o)
    t = jnp.asarray(step, jnp.float32) + 1
    m = jax.tree.map(lambda m, g: o.b1 * m + (1 - o.b1) * g.astype(jnp.float32) * scale, opt["m"], grads)
    v = jax.tree.map(lambda v, g: o.b2 * v + (1 - o.b2) * jnp.square(g.astype(jnp.float32) * scale), opt["v"], grads)

    def upd(p, m, v):
        u = (m / (1 - o.b1 ** t)) / (jnp.sqrt(v / (1 - o.b2 ** t)) + o.eps)
        if p.ndim >= 2:                              # no decay on norms, biases, A_log, dt_bias
            u = u + o.weight_decay * p.astype(jnp.float32)
        return (p.astype(jnp.float32) - lr * u).astype(p.dtype)

    return jax.tree.map(upd, params, m, v), {"m": m, "v": v}, gnorm, lr


# ------------------------------------------------------------------------------------------------
# The generic loop: jitted step, data parallel, Orbax checkpoints, resume, progress, time budget


def data_mesh(batch: int | None = None):
    """A 1-D ("data",) mesh over the most devices that divide `batch` evenly (all of them when None)."""
    n = jax.device_count()
    if batch is not None:
        n = max(k for k in range(1, n + 1) if batch % k == 0)
    return jax.sharding.Mesh(np.asarray(jax.devices()[:n]), ("data",),
                             axis_types=(jax.sharding.AxisType.Auto,))


def read_meta(f: Path, new_run: str = "--out") -> dict:
    """A checkpoint's metadata (Trainer.save's), or a one-line ConfigError naming the file."""
    try:
        meta = json.loads(Path(f).read_text())
        if not isinstance(meta, dict) or not {"step", "steps", "warmup", "losses"} <= set(meta):
            raise ValueError("not checkpoint metadata: it lacks step, steps, warmup or losses")
    except (OSError, ValueError) as e:                     # json.JSONDecodeError is a ValueError
        raise ConfigError(f"{f}: unreadable checkpoint metadata ({e}); delete it to resume from the checkpoint "
                          f"before it, or pass a new {new_run} to start another run") from None
    return meta


def step_meta(ckpt_dir: Path, step: int, new_run: str = "--out") -> dict | None:
    """The metadata of checkpoint `step` in ckpt_dir: meta/<step>.json, or the single meta.json of older jaxspec
    where it is for that step; None where there is none. Unreadable metadata is a ConfigError naming the file."""
    f = ckpt_dir / "meta" / f"{step}.json"
    if f.exists():
        meta = read_meta(f, new_run)
        if meta["step"] != step:
            raise ConfigError(f"{f}: unreadable checkpoint metadata (it is for step {meta['step']}); delete it to "
                              f"resume from the checkpoint before it, or pass a new {new_run} to start another run")
        return meta
    legacy = ckpt_dir / "meta.json"
    meta = read_meta(legacy, new_run) if legacy.exists() else None
    return meta if meta is not None and meta["step"] == step else None


def _legacy_step(f: Path) -> int | None:
    try:
        return int(json.loads(f.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def newest_meta(ckpt_dir: Path, new_run: str = "--out") -> dict | None:
    """The metadata of the newest checkpoint in ckpt_dir that has any (None: none), read without restoring it: for a
    caller to check a rerun's flags (`refuse_other_config`) before it makes its data."""
    steps = sorted((int(p.name) for p in Path(ckpt_dir).glob("*") if p.is_dir() and p.name.isdigit()), reverse=True)
    for step in steps:
        meta = step_meta(Path(ckpt_dir), step, new_run)
        if meta is not None:
            return meta
    return None


def config_changes(old: dict | None, new: dict | None) -> list[str]:
    """'flag: old -> new' for each setting that both configs record with different values (none if either is None,
    a checkpoint of older jaxspec recording none)."""
    if not old or not new:
        return []
    show = lambda v: " ".join(map(str, v)) if isinstance(v, list) else str(v)
    return [f"{k}: {show(old[k])} -> {show(new[k])}" for k in new if k in old and old[k] != new[k]]


def refuse_other_config(ckpt_dir: Path, meta: dict, config: dict | None, new_run: str = "--out") -> None:
    """A ConfigError naming each setting (old -> new) where checkpoint metadata `meta` records another than `config`."""
    changes = config_changes(meta.get("config"), json.loads(json.dumps(config)))
    if changes:
        raise ConfigError(f"{ckpt_dir} holds a run with other settings: {'; '.join(changes)}. Pass a new {new_run} "
                          f"to start another run, or the old flags to resume this one")


@jax.jit
def all_finite(tree) -> jax.Array:
    """Whether every entry of every leaf of `tree` is finite: one reduction on the device, one value to the host."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)] or [jnp.bool_(True)]))


class Interrupted(Exception):
    """Training stopped by SIGINT (Ctrl-C) or SIGTERM (`timeout`, a scheduler's preemption) between two steps;
    `saved`: the checkpoint dir it saved to, or None; `signum`: the signal."""

    def __init__(self, name: str, step: int, saved: Path | None, signum: int = signal.SIGINT):
        self.name, self.step, self.saved, self.signum = name, step, saved, signum
        super().__init__(f"{name}: interrupted at step {step}; "
                         + (f"checkpoint saved in {saved}; rerun the same command to resume" if saved else
                            "no checkpoint saved; rerun the same command to start again"))


class Trainer:
    """Runs `loss_fn(params, frozen, batch) -> loss` for `steps` steps with AdamW (`evaluate` uses
    `eval_loss_fn`, by default the same).

    batch_at(step) -> dict of numpy arrays, batch axis first (sharded over the devices); it must be a pure
    function of the step, so that a resumed run sees the batches the interrupted one would have seen.
    frozen: a pytree passed to every step (replicated), not trained. `steps` and `warmup` are arguments
    of the compiled step (changing them does not recompile). Checkpoints hold the params and optimizer
    state (Orbax, ckpt_dir/<step>) and, in ckpt_dir/meta/<step>.json, written before the step's arrays, the
    step, `steps`, `warmup`, the losses so far, `steps_asked` and `config`, so a resume continues on exactly
    the same schedule. `config` (a JSON-able dict, flag -> value: what shapes the run) is compared on restore:
    a checkpoint of other settings is refused (ConfigError naming each, old -> new). `restore` takes the
    newest step that restores cleanly, moving any that does not to ckpt_dir/unrestorable/ (said on stderr).
    `steps_asked`: the step count the command asked for (a fresh run with a time budget may schedule fewer),
    kept with the checkpoints so that the caller can tell a rerun that asks for another count. `run` defers a
    SIGINT (Ctrl-C) or SIGTERM to the end of the current step, saves and raises `Interrupted`.
    """

    def __init__(self, loss_fn: Callable, params, frozen, batch_at: Callable[[int], dict], *, steps: int,
                 opt: OptConfig, ckpt_dir: str | Path | None = None, ckpt_every: int = 200, name: str = "train",
                 log_every: int = 20, eval_loss_fn: Callable | None = None, config: dict | None = None,
                 steps_asked: int | None = None, new_run: str = "--out"):
        self.loss_fn, self.batch_at, self.steps, self.opt = loss_fn, batch_at, int(steps), opt
        self.config = json.loads(json.dumps(config)) if config is not None else None   # as it reads back
        self.steps_asked, self.new_run = steps_asked, new_run
        self.eval_loss_fn = eval_loss_fn or loss_fn
        self.warmup = opt.warmup
        self.name, self.log_every, self.ckpt_every = name, log_every, ckpt_every
        first = batch_at(0)
        self.mesh = data_mesh(len(next(iter(first.values()))))
        if self.mesh.size < jax.device_count():
            log(f"{name}: batch {len(next(iter(first.values())))} is data parallel over {self.mesh.size} of "
                f"{jax.device_count()} devices (make it a multiple of the device count to use them all)")
        rep = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        self.data_sharding = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec("data"))
        self.params = jax.device_put(params, rep)
        self.frozen = jax.device_put(frozen, rep)
        self.opt_state = jax.device_put(adamw_init(params), rep)
        self.step = 0
        self.losses: list[float] = []
        self._pending: list = []
        self.diverged: int | None = None     # the first step whose loss was not finite: nothing is saved after it
        self.ckpt_dir = Path(ckpt_dir).absolute() if ckpt_dir else None
        if self.ckpt_dir is not None and (problem := orbax_path_problem(self.ckpt_dir)):
            raise ValueError(f"{name}: checkpoint dir {self.ckpt_dir}: {problem}")
        self._mgr = None
        self._step_fn = jax.jit(self._train_step, donate_argnums=(0, 1))
        self._eval_fn = None
        self._stop = False

    def _train_step(self, params, opt_state, frozen, batch, step, sched):
        with dispatch.differentiable():   # the GPU's default kernels have no VJP
            loss, grads = jax.value_and_grad(self.loss_fn)(params, frozen, batch)
        o = dataclasses.replace(self.opt, warmup=sched[1])
        params, opt_state, gnorm, lr = adamw_update(params, grads, opt_state, step, sched[0], o)
        return params, opt_state, loss, gnorm, lr

    def evaluate(self, batches) -> float:
        """Mean loss of the current params over `batches` (an iterable of host batches like batch_at's), without
        training on them."""
        if self._eval_fn is None:
            def ev(params, frozen, batch):
                with dispatch.differentiable():      # the same ops as the training step
                    return self.eval_loss_fn(params, frozen, batch)
            self._eval_fn = jax.jit(ev)
        put = lambda b: jax.device_put({k: np.asarray(v) for k, v in b.items()}, self.data_sharding)
        losses = [self._eval_fn(self.params, self.frozen, put(b)) for b in batches]
        if not losses:
            raise ValueError(f"{self.name}: no batches to evaluate")
        return float(np.mean(jax.device_get(losses)))

    # -- checkpoints --
    def _manager(self):
        if self._mgr is None and self.ckpt_dir is not None:
            import orbax.checkpoint as ocp
            self._mgr = ocp.CheckpointManager(self.ckpt_dir, options=ocp.CheckpointManagerOptions(max_to_keep=2))
        return self._mgr

    def _arrays(self):
        leaves = lambda t: {str(i): x for i, x in enumerate(jax.tree.leaves(t))}
        return {"params": leaves(self.params), "m": leaves(self.opt_state["m"]), "v": leaves(self.opt_state["v"])}

    def _meta(self) -> dict:
        return {"step": self.step, "steps": self.steps, "warmup": self.warmup, "losses": self.losses,
                "steps_asked": self.steps_asked, "config": self.config}

    def save(self):
        """Checkpoint the current step, unless training has diverged (a non-finite loss, or params): the last good
        checkpoint is kept as the newest, so that it is the one a rerun resumes and Orbax's max_to_keep never
        deletes it for a diverged one."""
        self.flush()
        mgr = self._manager()
        if mgr is None or (mgr.latest_step() == self.step):
            return
        if self.diverged is None and not all_finite(self.params):
            self.diverged = self.step
        if self.diverged is not None:
            log(f"{self.name}: not saving step {self.step}: training diverged at step {self.diverged}; the last "
                f"checkpoint in {self.ckpt_dir} is kept" + (f" (step {mgr.latest_step()})" if mgr.all_steps() else ""))
            return
        import orbax.checkpoint as ocp
        # The step's metadata first: a step that exists always has its own (an interrupt in between leaves only
        # metadata for a step that does not exist, which nothing reads).
        write_atomic(self.ckpt_dir / "meta" / f"{self.step}.json", json.dumps(self._meta()))
        mgr.save(self.step, args=ocp.args.StandardSave(self._arrays()), force=True)
        mgr.wait_until_finished()
        kept = set(mgr.all_steps())
        for f in (self.ckpt_dir / "meta").glob("*.json"):       # those of the steps Orbax no longer keeps
            if not (f.stem.isdigit() and int(f.stem) in kept):
                f.unlink(missing_ok=True)
        legacy = self.ckpt_dir / "meta.json"                      # the one file of older jaxspec, for one step
        if legacy.exists() and (_legacy_step(legacy) not in kept):
            legacy.unlink(missing_ok=True)

    def restore(self) -> bool:
        """Resume from the newest checkpoint that restores, if any. True when one was restored. Newer steps whose
        arrays do not restore, or that have no metadata, are then moved to ckpt_dir/unrestorable/ (said on stderr),
        so that the run can save those steps again. Unreadable metadata, a checkpoint of another `config`, or steps
        none of which restores are a ConfigError (nothing moved)."""
        mgr = self._manager()
        if mgr is None or not mgr.all_steps():
            return False
        import orbax.checkpoint as ocp
        bad = []
        for step in sorted(mgr.all_steps(), reverse=True):
            meta = step_meta(self.ckpt_dir, step, self.new_run)
            if meta is None:
                bad.append((step, "it has no metadata (meta/<step>.json)"))
                continue
            self.check_config(meta)
            cur = self._arrays()
            abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), cur)
            try:
                got = mgr.restore(step, args=ocp.args.StandardRestore(abstract))
            except Exception as e:      # noqa: BLE001 -- Orbax/TensorStore raise many kinds for damaged files
                bad.append((step, f"its arrays do not restore ({type(e).__name__}: "
                                  f"{(str(e).splitlines() or [''])[0][:200]})"))
                continue
            for s, why in bad:
                self._set_aside(s, why)
            unflat = lambda like, d: jax.tree.unflatten(jax.tree.structure(like), [d[str(i)] for i in range(len(d))])
            self.params = unflat(self.params, got["params"])
            self.opt_state = {"m": unflat(self.opt_state["m"], got["m"]), "v": unflat(self.opt_state["v"], got["v"])}
            self.step, self.steps, self.warmup = step, meta["steps"], meta["warmup"]
            self.losses = list(meta["losses"])
            self.steps_asked = meta.get("steps_asked", self.steps_asked)
            log(f"{self.name}: resumed from {self.ckpt_dir} at step {self.step}/{self.steps}")
            return True
        raise ConfigError(f"{self.ckpt_dir}: no checkpoint restores ({'; '.join(f'step {s}: {w}' for s, w in bad)}); "
                          f"pass a new {self.new_run} to start another run")

    def _set_aside(self, step: int, why: str) -> None:
        """Move checkpoint `step` (and its metadata) to ckpt_dir/unrestorable/, so that a resumed run can save that
        step again, saying so and `why` on stderr."""
        aside = self.ckpt_dir / "unrestorable"
        aside.mkdir(exist_ok=True)
        dest = aside / str(step)
        n = 1
        while dest.exists():
            dest, n = aside / f"{step}.{n}", n + 1
        os.rename(self.ckpt_dir / str(step), dest)
        meta = self.ckpt_dir / "meta" / f"{step}.json"
        if meta.exists():
            os.replace(meta, dest.with_name(dest.name + ".json"))
        if self._mgr is not None:                 # the manager lists the steps it found when made
            self._mgr.close()
            self._mgr = None
        log(f"{self.name}: skipping the checkpoint of step {step} in {self.ckpt_dir}: {why}; moved to {dest}")

    def check_config(self, meta: dict) -> None:
        """ConfigError when checkpoint metadata `meta` is of a run with other settings than this one's `config`."""
        refuse_other_config(self.ckpt_dir, meta, self.config, self.new_run)

    # -- the loop --
    def _load(self, step: int):
        return jax.device_put({k: np.asarray(v) for k, v in self.batch_at(step).items()}, self.data_sharding)

    def run_step(self, batch=None):
        """One step (on `batch`, else batch_at(step)); returns the loss as a device scalar, not waited for.
        The losses reach `self.losses` (as floats) at the next `flush`."""
        batch = self._load(self.step) if batch is None else batch
        sched = jnp.asarray([self.steps, self.warmup], jnp.float32)
        self.params, self.opt_state, loss, gnorm, lr = self._step_fn(
            self.params, self.opt_state, self.frozen, batch, jnp.asarray(self.step, jnp.int32), sched)
        self._last = (loss, gnorm, lr)
        self._pending.append(loss)
        self.step += 1
        return loss

    def flush(self) -> list[float]:
        """Wait for the steps dispatched so far; move their losses to `self.losses`; raise on a non-finite one
        (FloatingPointError; `diverged` is then set, and `save` saves nothing more)."""
        got = [float(x) for x in jax.device_get(self._pending)]
        first = self.step - len(got)
        self._pending = []
        self.losses += got
        for i, loss in enumerate(got):
            if not math.isfinite(loss):
                self.diverged = first + i + 1 if self.diverged is None else self.diverged
                raise FloatingPointError(f"{self.name}: loss {loss} at step {first + i + 1}: training diverged")
        return got

    def snapshot(self):
        """The params, optimizer state, step and losses, copied to the host, for `rewind`."""
        self.flush()
        host = jax.tree.map(np.array, (self.params, self.opt_state))     # copies: the device arrays get donated
        return host, self.step, list(self.losses)

    def rewind(self, snap) -> None:
        """Back to `snapshot` `snap`: its params, optimizer state, step and losses."""
        (params, opt_state), self.step, losses = snap
        self.losses = list(losses)
        rep = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        self.params, self.opt_state = jax.device_put(params, rep), jax.device_put(opt_state, rep)

    def run(self, deadline: float | None = None, max_steps: int | None = None, save: bool = True) -> list[float]:
        """Train until `steps` (or `max_steps` more steps, or the wall-clock `deadline`); checkpoint every
        `ckpt_every` steps and on exit (neither when not `save`).
        The next batch is read and sent to the devices on a host thread while the current step runs, and
        the host waits for the devices only every `log_every` steps."""
        from concurrent.futures import ThreadPoolExecutor
        t0, s0 = time.perf_counter(), self.step
        stop = self.steps if max_steps is None else min(self.steps, self.step + max_steps)
        self._stop, old_handlers = False, {}
        if threading.current_thread() is threading.main_thread():
            old_handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        quit_now = False
        try:
            with ThreadPoolExecutor(1) as pool:
                nxt = pool.submit(self._load, self.step) if self.step < stop else None
                while self.step < stop and not self._stop:
                    batch = nxt.result()
                    nxt = pool.submit(self._load, self.step + 1) if self.step + 1 < stop else None
                    self.run_step(batch)
                    if self.step % self.log_every == 0 or self.step == stop:
                        self.flush()
                        _, gnorm, lr = self._last
                        rate = (self.step - s0) / max(time.perf_counter() - t0, 1e-9)
                        log(f"{self.name}: step {self.step}/{self.steps} loss {np.mean(self.losses[-self.log_every:]):.4f} "
                            f"|g| {float(gnorm):.3f} lr {float(lr):.2e} ({rate:.1f} steps/s)")
                    if save and self.ckpt_every and self.step % self.ckpt_every == 0 and self.step < stop:
                        self.save()
                    if deadline is not None and time.time() > deadline:
                        log(f"{self.name}: time budget reached at step {self.step}/{self.steps}")
                        break
                if nxt is not None:
                    nxt.cancel()
        except KeyboardInterrupt:       # a second Ctrl-C: out now, the arrays maybe donated to an unfinished step
            quit_now = True
            raise
        finally:
            try:
                if not quit_now:
                    self.flush()
                    if save:
                        self.save()
            finally:
                for sig, handler in old_handlers.items():
                    signal.signal(sig, handler)
        if self._stop:
            raise Interrupted(self.name, self.step, self.ckpt_dir if save and self.ckpt_dir else None, self._stop)
        return self.losses

    def _on_signal(self, signum, frame):
        """SIGINT or SIGTERM during `run`: stop after the current step (whose jitted call owns the donated params and
        optimizer state until it returns), then save; a second one quits at once. `_stop` keeps the signal."""
        if self._stop:
            raise KeyboardInterrupt
        self._stop = signum
        log(f"{self.name}: {signal.Signals(signum).name}; stopping once the current step is done, to save a "
            f"checkpoint (again to quit at once)")


def calibrate_steps(trainer: Trainer, seconds: float, probe: int = 20, cap: int | None = None) -> int:
    """Time `probe` steps of the training loop after the compiling first one and return how many steps fit
    in `seconds` (counting those already run). The probe saves no checkpoint, and the trainer is then rewound
    to where it was (params, optimizer state, step, losses): its steps ran on the schedule of the trainer's
    `steps` before calibration, so the calibrated run starts as a plain run of that many steps would."""
    t_start = time.perf_counter()
    start = trainer.snapshot()
    float(trainer.run_step())                            # compiles
    trainer.flush()
    t1 = time.perf_counter()
    trainer.run(max_steps=probe, save=False)             # the loop as it runs: batches made while steps run
    per = (time.perf_counter() - t1) / probe
    trainer.rewind(start)
    left = seconds - (time.perf_counter() - t_start)
    n = trainer.step + max(int(left / max(per, 1e-6)), 1)
    n = min(n, cap) if cap else n
    log(f"{trainer.name}: {per * 1e3:.1f} ms/step (compile {t1 - t_start:.1f}s) -> {n} steps")
    return n


# ------------------------------------------------------------------------------------------------
# Target language model


def target_loss(graphdef):
    """Next-token cross-entropy of the target over a chain; batch {"tokens": [b, T + 1]}."""
    def loss(params, frozen, batch):
        model = nnx.merge(graphdef, params)
        tokens = batch["tokens"]
        x, y = tokens[:, :-1], tokens[:, 1:]
        b, t = x.shape
        logits, _, _, _ = model(x, init_state(model.cfg, b, t), trees.chain(b, t))
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.mean(jnp.take_along_axis(logp, y[..., None], -1))
    return loss


def stream_batches(stream: np.ndarray, batch: int, seq: int, seed: int):
    """batch_at(step): `batch` random windows of seq + 1 tokens of `stream`, a pure function of step."""
    hi = len(stream) - seq          # window starts 0..hi-1: the last window ends at the stream's last token
    if hi <= 0:
        raise ValueError(f"token stream of {len(stream)} tokens is shorter than one sequence of {seq + 1}")

    def at(step):
        starts = np.random.default_rng([seed, step]).integers(0, hi, batch)
        return {"tokens": np.stack([stream[s:s + seq + 1] for s in starts]).astype(np.int32)}
    return at


# ------------------------------------------------------------------------------------------------
# DFlash drafter


def default_gamma(block: int) -> float:
    """The loss decay of reference/dflash.md section 4: 7 for B = 16, 5 for B = 10, 4 for B = 8."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block, 7.0 * block / 16)


def loss_weights(block: int, gamma: float) -> np.ndarray:
    """w_k = exp(-(k - 1) / gamma) for block slots k = 1..B-1."""
    return np.exp(-(np.arange(1, block) - 1) / gamma).astype(np.float32)


def block_masks(anchors, t: int, block: int, causal: bool, window: int | None):
    """Visibility of A blocks per sequence: anchors [b, A] -> [b, A*B, t + A*B] over (context rows 0..t-1,
    the blocks' own rows). Query row j*B + s is slot s of block j, at position anchors[j] + s. It sees
    context row p iff p < anchors[j] (strictly before the anchor) and the layer's causality/window allow
    (q - p), and block row j'*B + s' iff j' == j and the layer allows (s - s'). These are `Drafter.draft`'s
    masks, one block at a time, laid side by side."""
    b, a = anchors.shape
    q_pos = (anchors[:, :, None] + jnp.arange(block, dtype=jnp.int32)).reshape(b, a * block)
    q_anchor = jnp.repeat(anchors, block, 1)
    ctx = jnp.arange(t, dtype=jnp.int32)[None, None, :]
    ctx_vis = (ctx < q_anchor[:, :, None]) & _visible(q_pos[:, :, None], ctx, causal, window)
    blk = jnp.arange(a * block) // block
    same = (blk[:, None] == blk[None, :])[None]
    blk_vis = same & _visible(q_pos[:, :, None], q_pos[:, None, :], causal, window)
    return jnp.concatenate([ctx_vis, blk_vis], 2), q_pos


def drafter_block_logits(drafter: Drafter, taps, tokens, anchors, embed, lm_head):
    """Logits [b, A, B-1, V] (fp32) of every block: taps [b, t, n_taps, D] of the target on tokens [b, t],
    anchors [b, A] with anchor + B - 1 < t. The same modules and masks as `Drafter.add_context` + `draft`."""
    cfg = drafter.cfg
    bs = cfg.block_size
    b, t = tokens.shape
    a = anchors.shape[1]
    c = drafter.hidden_norm(drafter.fc(taps.reshape(b, t, -1).astype(cfg.jnp_dtype)))
    ctx_pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
    anchor_tok = jnp.take_along_axis(tokens, anchors, 1)
    blk_tok = jnp.concatenate([anchor_tok[:, :, None], jnp.full((b, a, bs - 1), cfg.mask_token_id, jnp.int32)], 2)
    x = jnp.take(embed, blk_tok.reshape(b, a * bs), axis=0).astype(cfg.jnp_dtype)
    for layer, causal, window in zip(drafter.layers, cfg.causal, cfg.windows):
        vis, q_pos = block_masks(anchors, t, bs, causal, window)
        k, v = layer.self_attn.kv(c, ctx_pos)
        x = x + layer.self_attn(layer.input_layernorm(x), q_pos, k, v, vis)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    h = drafter.norm(x).reshape(b, a, bs, -1)[:, :, 1:]
    return jnp.einsum("band,dv->banv", h, lm_head.astype(h.dtype)).astype(jnp.float32)


def drafter_loss(drafter_graphdef, target_graphdef, gamma: float):
    """The DFlash loss as the recipe states it, the target run inside every step (the CLIs train on cached
    features with `drafter_loss_cached`, which the tests check against this). frozen = the target's params
    (embedding and lm_head included); batch {"tokens": [b, t], "anchors": [b, A]}. The target's taps are
    computed under stop_gradient; labels are the tokens themselves."""
    def loss(params, frozen, batch):
        drafter = nnx.merge(drafter_graphdef, params)
        target = nnx.merge(target_graphdef, frozen)
        cfg = drafter.cfg
        tokens, anchors = batch["tokens"], batch["anchors"]
        b, t = tokens.shape
        _, taps, _, _ = target(tokens, init_state(target.cfg, b, t), trees.chain(b, t),
                               taps=tuple(cfg.target_layer_ids), commit_n=_whole(b, t))
        taps = jax.lax.stop_gradient(taps)
        logits = drafter_block_logits(drafter, taps, tokens, anchors, jax.lax.stop_gradient(target.embed_tokens[...]),
                                      jax.lax.stop_gradient(target.unembedding()))
        labels = jnp.take_along_axis(tokens, (anchors[:, :, None] + jnp.arange(1, cfg.block_size)).reshape(b, -1),
                                     1).reshape(anchors.shape + (cfg.block_size - 1,))
        ce = -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), labels[..., None], -1)[..., 0]   # [b, A, B-1]
        w = jnp.asarray(loss_weights(cfg.block_size, gamma))
        return jnp.mean(jnp.sum(ce * w, -1) / jnp.sum(w))
    return loss


def sample_anchors(rng: np.random.Generator, n_seq: int, t: int, block: int, n_anchors: int, lo) -> np.ndarray:
    """Per sequence, n_anchors distinct sorted anchors in [lo, t - block] (lo [n_seq] or a scalar)."""
    lo = np.broadcast_to(np.asarray(lo), (n_seq,))
    pos = np.arange(t)[None]
    ok = (pos >= lo[:, None]) & (pos <= t - block)
    if ok.sum(1).min() < n_anchors:
        raise ValueError(f"only {ok.sum(1).min()} valid anchor positions for {n_anchors} anchors per sequence")
    keys = np.where(ok, rng.random((n_seq, t)), 2.0)
    return np.sort(np.argsort(keys, 1)[:, :n_anchors], 1).astype(np.int32)


def drafter_batches(seqs: np.ndarray, lo, batch: int, block: int, n_anchors: int, seed: int):
    """batch_at(step): `batch` of the sequences [N, t] (with anchor lower bounds lo [N]) and their anchors."""
    lo = np.broadcast_to(np.asarray(lo), (len(seqs),))

    def at(step):
        rng = np.random.default_rng([seed, step])
        idx = rng.integers(0, len(seqs), batch)
        return {"tokens": seqs[idx].astype(np.int32),
                "anchors": sample_anchors(rng, batch, seqs.shape[1], block, n_anchors, lo[idx])}
    return at


# ------------------------------------------------------------------------------------------------
# Teacher-forced corpus data: the drafter's context features precomputed once


def corpus_windows(stream: np.ndarray, window: int, seed: int) -> np.ndarray:
    """Start offsets of all non-overlapping `window`-token windows of `stream`, in a seeded random order (so
    any prefix of them is a uniform sample of the corpus)."""
    n = len(stream) // window
    if n == 0:
        raise ValueError(f"token stream of {len(stream)} tokens is shorter than one window of {window}")
    return (np.random.default_rng(seed).permutation(n) * window).astype(np.int64)


def _whole(b: int, t: int):
    """commit_n for a teacher-forced forward of [b, t] tokens whose state nobody reads: as a prefill commits, so that
    a chain of more than one block runs the chain delta rule (pallas_kernels/tree_delta_rule/chain.py) and no
    per-token terms are kept for a later `commit`."""
    return jnp.full((b,), t, jnp.int32)


def target_taps_greedy(target: Qwen35, tokens, tap_ids: tuple, log_probs: bool = False):
    """(taps [b, t, n_taps, D] float16, greedy [b, t] int32): the target's tapped hidden states and its greedy
    prediction for the next position, teacher-forced on tokens [b, t]; with log_probs, also its
    log-probabilities of the next token [b, t, V] (float32)."""
    b, t = tokens.shape
    logits, taps, _, _ = target(tokens, init_state(target.cfg, b, t), trees.chain(b, t), taps=tuple(tap_ids),
                                commit_n=_whole(b, t))
    out = (taps.astype(jnp.float16), jnp.argmax(logits, -1).astype(jnp.int32))
    return out + (jax.nn.log_softmax(logits.astype(jnp.float32), -1),) if log_probs else out


def target_features_fn(target: Qwen35, tap_ids: tuple):
    """jit(tokens [b, t]) -> `target_taps_greedy` of the target on them."""
    graphdef, state = nnx.split(target)

    @jax.jit
    def f(state, tokens):
        return target_taps_greedy(nnx.merge(graphdef, state), tokens, tap_ids)
    return lambda tokens: f(state, jnp.asarray(tokens, jnp.int32))


def model_fingerprint(model) -> str:
    """A short digest of a model's parameters (each one's path, shape and a strided sample of up to 4096 of its
    values, as float32): tells whether saved data was made by this very model."""
    h = hashlib.sha1()
    leaves, _ = jax.tree_util.tree_flatten_with_path(nnx.state(model))
    for path, x in sorted(leaves, key=lambda t: jax.tree_util.keystr(t[0])):
        sample = np.asarray(jax.device_get(jnp.ravel(x)[::max(1, x.size // 4096)]), np.float32)
        h.update(f"{jax.tree_util.keystr(path)}{tuple(x.shape)};".encode())
        h.update(sample.tobytes())
    return h.hexdigest()[:16]


def array_digest(a: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


class FeatureCache:
    """On-disk cache of teacher-forced target features for fixed windows of a token stream:
    tokens [N, W] int32, greedy [N, W] int32 (the target's argmax for position p + 1 given tokens[..p]) and
    taps [N, W, n_taps, D] float16, as numpy memmaps in `path`, with meta.json holding how many windows are
    done. `build` fills it in order and can be interrupted and resumed; readers use the first `done` windows.
    meta.json also records the stream's digest and the target's fingerprint: a cache made from other
    tokens or by another target is made again, never reused."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.meta = json.loads((self.path / "meta.json").read_text()) if (self.path / "meta.json").exists() else None

    @property
    def done(self) -> int:
        return int(self.meta["done"]) if self.meta else 0

    def arrays(self, mode="r"):
        m = self.meta
        n, w, k, d = m["windows"], m["window"], m["n_taps"], m["hidden"]
        mm = lambda name, dt, shape: np.memmap(self.path / name, dt, mode, shape=shape)
        return (mm("tokens.i32", np.int32, (n, w)), mm("greedy.i32", np.int32, (n, w)),
                mm("taps.f16", np.float16, (n, w, k, d)))

    def build(self, target: Qwen35, stream: np.ndarray, tap_ids, window: int, n_windows: int, seed: int,
              batch: int = 32, deadline: float | None = None, extend: bool = True) -> int:
        """Teacher-force the target over n_windows windows of the stream (random, non-overlapping); returns
        the number of windows done (fewer when the wall-clock deadline comes first; a later call resumes). Not
        `extend`: a cache of these windows that has any is kept as it is (a drafter trains on it already)."""
        starts = corpus_windows(stream, window, seed)[:n_windows]
        want = {"windows": int(len(starts)), "window": int(window), "n_taps": len(tap_ids),
                "hidden": int(target.cfg.hidden_size), "taps": list(map(int, tap_ids)), "seed": int(seed),
                "stream_tokens": int(len(stream)), "stream_sha1": array_digest(stream.astype(np.int32)),
                "target": model_fingerprint(target)}
        if self.meta is not None and self.meta.get("target", want["target"]) != want["target"]:
            log(f"features: {self.path} holds another target's features; making them again")
        same = self.meta is not None and all(self.meta.get(k) == v for k, v in want.items())
        if same and self.done and not extend:
            log(f"features: kept at {self.done}/{len(starts)} windows in {self.path}, not extended: a drafter "
                f"trains on them")
            return self.done
        if not same:
            self.path.mkdir(parents=True, exist_ok=True)
            self.meta = dict(want, done=0)
            for name, dt, shape in (("tokens.i32", np.int32, (len(starts), window)),
                                    ("greedy.i32", np.int32, (len(starts), window)),
                                    ("taps.f16", np.float16, (len(starts), window, len(tap_ids),
                                                              target.cfg.hidden_size))):
                np.memmap(self.path / name, dt, "w+", shape=shape).flush()
            self._write_meta()
        toks_mm, greedy_mm, taps_mm = self.arrays("r+")
        f = target_features_fn(target, tuple(tap_ids))
        t0, i0 = time.time(), self.done
        for i in range(self.done, len(starts), batch):
            idx = starts[i:i + batch]
            toks = np.stack([stream[s:s + window] for s in idx]).astype(np.int32)
            pad = batch - len(toks)
            taps, greedy = f(np.concatenate([toks, np.repeat(toks[:1], pad, 0)]) if pad else toks)
            toks_mm[i:i + len(idx)] = toks
            greedy_mm[i:i + len(idx)] = np.asarray(greedy)[:len(idx)]
            taps_mm[i:i + len(idx)] = np.asarray(taps)[:len(idx)]
            self.meta["done"] = i + len(idx)
            if (i // batch) % 8 == 7 or self.done == len(starts):
                for a in (toks_mm, greedy_mm, taps_mm):
                    a.flush()
                self._write_meta()
                rate = (self.done - i0) * window / max(time.time() - t0, 1e-9)
                log(f"features: {self.done}/{len(starts)} windows ({rate:.0f} tokens/s)")
            if deadline is not None and time.time() > deadline:
                break
        for a in (toks_mm, greedy_mm, taps_mm):
            a.flush()
        self._write_meta()
        return self.done

    def _write_meta(self):
        tmp = self.path / "meta.json.tmp"
        tmp.write_text(json.dumps(self.meta))
        os.replace(tmp, self.path / "meta.json")


def block_labels(tokens, greedy, anchors, block: int, exact: bool = True):
    """Self-distillation labels of teacher-forced blocks. tokens, greedy [b, t] (greedy[p]: the target's
    argmax for position p + 1 given tokens[..p]), anchors [b, A] -> labels, valid [b, A, B-1].
    Slot k (position anchor + k) is labelled greedy[anchor + k - 1]. That is exactly the target's own greedy
    continuation from the anchor while the stream follows it, i.e. while tokens[anchor + j] ==
    greedy[anchor + j - 1] for j < k; with `exact`, slots after the first disagreement are masked out
    (their label would be the target's prediction after a token it would not have produced)."""
    b, a = anchors.shape
    pos = anchors[:, :, None] + jnp.arange(1, block)                           # [b, A, B-1]
    flat = lambda x, q: jnp.take_along_axis(x, q.reshape(b, -1), 1).reshape(q.shape)
    labels = flat(greedy, pos - 1)
    if not exact:
        return labels, jnp.ones(labels.shape, bool)
    follows = flat(tokens, pos) == labels                                       # stream takes the greedy token
    valid = jnp.concatenate([jnp.ones((b, a, 1), bool), jnp.cumprod(follows[..., :-1], -1).astype(bool)], -1)
    return labels, valid


def drafter_loss_cached(drafter_graphdef, gamma: float, exact: bool = True, soft: float = 0.0):
    """The DFlash loss on precomputed target features (`FeatureCache`): frozen = {"embed", "lm_head"} (the
    target's, shared by the drafter); batch {"tokens", "greedy": [b, t], "taps": [b, t, n_taps, D],
    "anchors": [b, A]}. Labels and mask from `block_labels`; the weighted cross-entropy is normalised by the
    total weight of the valid slots. soft > 0: each slot's loss is (1 - soft) x the cross-entropy on the greedy
    label + soft x the cross-entropy on the target's whole distribution there (the soft label; EAGLE trains
    its drafter's classification loss on it), from batch["target_logp"] [b, t, V] (position p: the next token's)."""
    if not 0.0 <= soft <= 1.0:
        raise ValueError(f"soft label weight {soft} is not in [0, 1]")

    def loss(params, frozen, batch):
        drafter = nnx.merge(drafter_graphdef, params)
        bs = drafter.cfg.block_size
        anchors = batch["anchors"]
        logits = drafter_block_logits(drafter, batch["taps"], batch["tokens"], anchors,
                                      frozen["embed"], frozen["lm_head"])
        labels, valid = block_labels(batch["tokens"], batch["greedy"], anchors, bs, exact)
        logq = jax.nn.log_softmax(logits, -1)
        ce = -jnp.take_along_axis(logq, labels[..., None], -1)[..., 0]                         # [b, A, B-1]
        if soft:
            pos = (anchors[:, :, None] + jnp.arange(bs - 1)).reshape(anchors.shape[0], -1)    # slot k: anchor+k-1
            p = jnp.exp(jax.vmap(lambda lp, i: lp[i])(batch["target_logp"], pos)).reshape(logq.shape)
            ce = (1.0 - soft) * ce - soft * jnp.sum(p * logq, -1)
        w = jnp.asarray(loss_weights(bs, gamma)) * valid
        return jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1e-6)
    return loss


def drafter_loss_live(drafter_graphdef, target_graphdef, tap_ids: tuple, gamma: float, exact: bool = True,
                      soft: float = 0.0):
    """`drafter_loss_cached` with the target's features made inside the step instead of read from a cache:
    frozen = {"embed", "lm_head", "target": the target's params}; batch {"tokens": [b, t], "anchors": [b, A]}.
    The taps are rounded to float16 as the cache stores them, so both give the same loss on the same tokens.
    No disk and no feature-making phase: every training sequence can be a fresh one. soft: the soft-label
    weight of `drafter_loss_cached`, the target's distribution coming from the same forward."""
    cached = drafter_loss_cached(drafter_graphdef, gamma, exact, soft)

    def loss(params, frozen, batch):
        target = nnx.merge(target_graphdef, frozen["target"])
        feats = target_taps_greedy(target, batch["tokens"], tap_ids, log_probs=bool(soft))
        feats = jax.lax.stop_gradient(dict(zip(("taps", "greedy", "target_logp"), feats)))
        return cached(params, frozen, {**batch, **feats})
    return loss


def cached_batches(cache: "FeatureCache", n_windows: int, batch: int, block: int, n_anchors: int, lo: int,
                   seed: int):
    """batch_at(step): `batch` of the cache's first n_windows windows, with n_anchors anchors >= lo each."""
    toks, greedy, taps = cache.arrays()
    w = toks.shape[1]

    def at(step):
        rng = np.random.default_rng([seed, step])
        idx = np.sort(rng.integers(0, n_windows, batch))
        return {"tokens": np.asarray(toks[idx]), "greedy": np.asarray(greedy[idx]), "taps": np.asarray(taps[idx]),
                "anchors": sample_anchors(rng, batch, w, block, n_anchors, lo)}
    return at


def held_out_batches(rows: Callable[[np.ndarray], dict], n: int, t: int, batch: int, block: int, n_anchors: int,
                     lo: int, seed: int):
    """A function giving, at each call, the same fixed batches over n held-out rows: consecutive chunks of
    `batch` rows (a remainder smaller than `batch` is left out) with seeded anchors >= lo. rows(idx) -> the
    rows' arrays (a dict, batch axis first; "anchors" is added)."""
    rng = np.random.default_rng([seed, 1 << 20])
    chunks = [(np.arange(i, i + batch), sample_anchors(rng, batch, t, block, n_anchors, lo))
              for i in range(0, n - batch + 1, batch)]
    return lambda: ({**rows(idx), "anchors": a} for idx, a in chunks)


def mixed_batches(*batch_fns):
    """batch_at(step) concatenating the batches of several batch_at functions (same keys and shapes but the
    batch axis), e.g. corpus windows and greedy continuations in a fixed proportion."""
    def at(step):
        parts = [f(step) for f in batch_fns]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return at


def epochs_seen(steps: int, batch: int, n_anchors: int, n_sequences: int, anchor_positions: int) -> float:
    """How many times the training blocks cover the data: steps * batch * anchors / (sequences * positions)."""
    return steps * batch * n_anchors / max(n_sequences * anchor_positions, 1)


def warn_epochs(name: str, epochs: float, limit: float) -> None:
    if epochs > limit:
        log(f"{name}: WARNING: the run covers each anchor position of the data {epochs:.0f} times (> {limit:g}); "
            f"a drafter trained on so little data overfits (held-out acceptance collapses): use more data "
            f"(--data corpus, more --sequences) or fewer steps")


def grow_drafter(drafter: Drafter, extra_layers: int, seed: int = 0) -> Drafter:
    """`drafter` with `extra_layers` more layers (of its last layer's type) after its own, each starting as the
    identity: random weights but zero output projections (o_proj, down_proj), so the residual stream passes
    through unchanged and the grown drafter drafts exactly as the old one until training moves them."""
    cfg = drafter.cfg
    grown_cfg = cfg.replace(layer_types=cfg.layer_types + (cfg.layer_types[-1],) * extra_layers)
    grown = Drafter(grown_cfg, rngs=nnx.Rngs(seed))
    grown.fc, grown.hidden_norm, grown.norm = drafter.fc, drafter.hidden_norm, drafter.norm
    for i, layer in enumerate(drafter.layers):
        grown.layers[i] = layer
    for layer in list(grown.layers)[cfg.num_layers:]:
        for lin in (layer.self_attn.o_proj, layer.mlp.down_proj):
            lin.kernel[...] = jnp.zeros_like(lin.kernel[...])
    return grown


def trainable_drafter_params(drafter: Drafter):
    return nnx.split(drafter)


# ------------------------------------------------------------------------------------------------
# Corpus, tokenizer, generation


def stdlib_files() -> list[Path]:
    """The standard library's .py files (PSF license), sorted, without site-packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(Path(f) for f in glob.glob(str(root / "**" / "*.py"), recursive=True)
                   if "site-packages" not in f and "dist-packages" not in f)
    return [f for f in files if f.is_file()]


PACKAGE_PARTS = ("target", "prompts")
# What `eval --matmul-precision` accepts: jax.default_matmul_precision's levels and the DotAlgorithmPresets that take
# fp32 products (the X3/X6/X9 ones split each fp32 operand into bf16 parts for the tensor cores).
MATMUL_PRECISIONS = ("default", "high", "highest", "bfloat16", "tensorfloat32", "float32", "F32_F32_F32",
                     "TF32_TF32_F32", "TF32_TF32_F32_X3", "BF16_BF16_F32", "BF16_BF16_F32_X3", "BF16_BF16_F32_X6",
                     "BF16_BF16_F32_X9")


def stdlib_name(f, root=None) -> str | None:
    """`f`'s path under the standard library (posix, relative to its root), None outside it: the name `pair`
    records for each file it used and `eval --unseen-by` matches, wherever the stdlib is installed."""
    root, f = Path(root or sysconfig.get_paths()["stdlib"]).resolve(), Path(f).resolve()
    return f.relative_to(root).as_posix() if f.is_relative_to(root) else None


def package_files(n: int, roots=None, min_bytes: int = 1_000, max_bytes: int = 100_000,
                  part: str | None = None) -> list[Path]:
    """n .py files of the installed Python packages (site-packages / dist-packages under `roots`, default this
    interpreter's), each min_bytes..max_bytes, evenly spaced over their sorted list: the same n files wherever
    the same packages are installed. Prompts from code the target never saw, beyond the few set-apart stdlib
    files (on the H200's image, 29 files, 0.14 M tokens, for 180 K prompts: bench/results/2026-12-01-h200-s18-*).
    `part` ("target" or "prompts") draws from one of two fixed halves, split by a hash of each file's path under
    its root: a target trained on the one half never sees the other's prompts, whatever n each asks for."""
    import site
    if n < 1:
        raise ValueError(f"package_files: n must be >= 1, got {n}")
    if part is not None and part not in PACKAGE_PARTS:
        raise ValueError(f"package_files: part must be one of {PACKAGE_PARTS} or None, got {part!r}")
    roots = roots or sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")} | set(site.getsitepackages()))
    found = {}
    for r in map(Path, roots):
        for f in glob.glob(str(r / "**" / "*.py"), recursive=True):
            found.setdefault(Path(f), Path(f).relative_to(r).as_posix())
    files = sorted(f for f in found if f.is_file() and min_bytes <= f.stat().st_size <= max_bytes)
    if part is not None:
        files = [f for f in files if zlib.crc32(found[f].encode()) % 2 == PACKAGE_PARTS.index(part)]
    if len(files) < n:
        raise ValueError(f"package_files: {len(files)} .py files of {min_bytes}..{max_bytes} bytes"
                         f"{f' in the {part!r} half' if part else ''} under {', '.join(map(str, roots))}; {n} wanted")
    return [files[i * len(files) // n] for i in range(n)]


def split_files(files: list[Path], held_out_every: int = 20, unseen: bool = False):
    """Every `held_out_every`-th file (by sorted path) is held out for evaluation: (train, held). With `unseen`,
    also the files half-way between those: (train, held, unseen), the drafter's prompts from text that neither
    the target trained on nor the evaluation reads."""
    held = [f for i, f in enumerate(files) if i % held_out_every == 0]
    if not unseen:
        return [f for i, f in enumerate(files) if i % held_out_every], held
    mid = held_out_every // 2
    train = [f for i, f in enumerate(files) if i % held_out_every not in (0, mid)]
    return train, held, [f for i, f in enumerate(files) if i % held_out_every == mid]


def pair_files(files: list[Path], unseen: bool, target_extra=(), prompt_extra=()):
    """`pair`'s files: (the target's training files, the evaluation's held-out files, the drafter's prompt files).
    The stdlib `files` split as `split_files`, the target's split plus `target_extra`; the drafter's prompt files
    are the unseen split plus `prompt_extra` (with `unseen`; else [], the prompts then come from the target's own
    text). The evaluation's held-out files are the same with or without the extras."""
    train, held, *rest = split_files(files, unseen=unseen)
    return list(train) + list(target_extra), held, (list(rest[0]) + list(prompt_extra)) if unseen else []


def read_text(f: Path) -> str:
    try:
        return f.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return ""


MIN_VOCAB = 258  # a byte-level BPE's 256 initial tokens, <|endoftext|> and <|mask|>


def train_tokenizer(texts, vocab_size: int):
    """Byte-level BPE (the `tokenizers` library) with <|endoftext|> (id 0) and <|mask|> (id 1)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[EOS_TOKEN, MASK_TOKEN], show_progress=False))
    return tok


def save_tokenizer(tok, out_dir: Path) -> None:
    from transformers import PreTrainedTokenizerFast
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, mask_token=MASK_TOKEN).save_pretrained(out_dir)


def encode_files(tok, files: list[Path]) -> list[np.ndarray]:
    texts = [t for t in (read_text(f) for f in files) if t]
    return [np.asarray(e.ids, np.int32) for e in tok.encode_batch(texts)]


def greedy_generate(model: Qwen35, prompts: np.ndarray, max_new: int, batch: int, engine=None) -> np.ndarray:
    """Greedy continuations [N, P + max_new] of prompts [N, P], through the engine (AR, batched, no stop).
    Pass the `engine` of an earlier call to reuse its compiled functions (a new one compiles them again)."""
    from jaxspec.engine import Engine
    eng = engine or Engine(model, stop_tokens=())
    out = []
    p = prompts.shape[1]
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        pad = batch - len(chunk)
        rows = [list(map(int, r)) for r in np.concatenate([chunk, np.repeat(chunk[:1], pad, 0)])]
        res = eng.generate(rows, max_new, max_len=p + max_new + 1)
        gen = np.asarray([r[:max_new] for r in res.tokens], np.int32)
        out.append(np.concatenate([chunk, gen[:len(chunk)]], 1))
    return np.concatenate(out)


def greedy_sequences(model: Qwen35, prompts: np.ndarray, max_new: int, batch: int, path: Path,
                     deadline: float | None = None, extend: bool = True) -> np.ndarray:
    """`greedy_generate` in chunks of `batch` prompts, the sequences so far saved to `path` (.npy) after each
    chunk, so a rerun with the same prompts and target continues where an interrupted one stopped (the
    target's fingerprint is kept beside it, in path.with_suffix(".json")). Stops early (fewer sequences) at
    the wall-clock `deadline`. Not `extend`: sequences found there are returned as they are, none added."""
    n, p = prompts.shape
    seqs = np.zeros((0, p + max_new), np.int32)
    meta_path = path.with_suffix(".json")
    target = model_fingerprint(model)
    if path.exists():
        prev = np.load(path)
        made_by = json.loads(meta_path.read_text()).get("target") if meta_path.exists() else None
        if made_by != target:
            log(f"greedy: {path} was made by {'another target' if made_by else 'an unrecorded target'}; "
                f"starting over")
        elif prev.shape[1] == p + max_new and len(prev) <= n and np.array_equal(prev[:, :p], prompts[:len(prev)]):
            seqs = prev
            if not extend and len(seqs):
                log(f"greedy: kept at {len(seqs)}/{n} sequences in {path}, not extended: a drafter trains on them")
                return seqs
            log(f"greedy: resuming at {len(seqs)}/{n} sequences from {path}")
    if len(seqs) < n:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not len(seqs):
            path.unlink(missing_ok=True)        # never left beside the new target's fingerprint
        meta_tmp = meta_path.with_suffix(".json.tmp")
        meta_tmp.write_text(json.dumps({"target": target}))
        os.replace(meta_tmp, meta_path)
    from jaxspec.engine import Engine
    eng = Engine(model, stop_tokens=())     # one engine: its round loop compiles once, not once per chunk
    t0, i0 = time.time(), len(seqs)
    for i in range(len(seqs), n, batch):
        seqs = np.concatenate([seqs, greedy_generate(model, prompts[i:i + batch], max_new, batch, engine=eng)])
        tmp = path.with_name(path.stem + ".tmp.npy")
        np.save(tmp, seqs)
        os.replace(tmp, path)
        log(f"greedy: {len(seqs)}/{n} sequences ({(len(seqs) - i0) * max_new / (time.time() - t0):.0f} tokens/s)")
        if deadline is not None and time.time() > deadline:
            break
    return seqs


def prompts_from(docs: list[np.ndarray], n: int, length: int, seed: int) -> np.ndarray:
    """n prompts of exactly `length` tokens at random places of random documents long enough."""
    rng = np.random.default_rng(seed)
    long = [d for d in docs if len(d) > length + 1]
    if not long:
        raise ValueError(f"no document longer than {length + 1} tokens")
    out = []
    for _ in range(n):
        d = long[rng.integers(len(long))]
        s = rng.integers(0, len(d) - length)
        out.append(d[s:s + length])
    return np.stack(out).astype(np.int32)


# ------------------------------------------------------------------------------------------------
# Sizes


@dataclasses.dataclass(frozen=True)
class PairSizes:
    vocab: int = 4096
    target: TargetConfig = None
    draft_layers: int = 2
    draft_heads: int = 4
    draft_kv: int = 2
    draft_head_dim: int = 64
    draft_ffn: int = 768
    block: int = 16
    taps: tuple = (1, 4, 6)
    # target training
    t_seq: int = 512
    t_batch: int = 64
    t_lr: float = 2e-3
    t_max_steps: int = 20000
    # data generation
    prompt_len: int = 64
    gen_new: int = 192
    gen_n: int = 49152         # few continuations get memorised: 8192 at ~10 epochs gave a drafter loss of 0.87
    gen_batch: int = 4096      # and held-out tau 1.17 (session 12); the greedy phase stops at its deadline anyway
    # drafter training. data "corpus": the target teacher-forced over windows of the training stream
    # (FeatureCache; labels = its own greedy predictions, see block_labels); "greedy": its greedy continuations
    # of gen_n prompts alone (too few are memorised: the first H200 run's 1024 gave tau 1.15); "mixed"
    # (default): both, their features cached, d_greedy_frac of each batch from the continuations (the CPU
    # retraining of the demo drafter learned little from corpus data alone)
    d_data: str = "mixed"
    d_greedy_frac: float = 0.75  # mixed: the share of each batch from the greedy continuations
    d_window: int = 256
    d_windows: int = 0         # corpus windows to precompute (0: the whole stream)
    d_batch: int = 64
    d_anchors: int = 16
    d_max_epochs: float = 20.0  # warn when the data is seen more often than this
    d_lr: float = 1e-3
    d_max_steps: int = 20000
    # evaluation
    eval_prompts: int = 16
    eval_new: int = 128
    budgets: tuple = (16, 32, 64)
    tokenizer_chars: int = 12_000_000


def target_config(vocab: int, d: int, ffn: int, layers: int, heads: int, kv: int, hd: int, lk: int, lv: int,
                  ldim: int, dtype: str = "float32") -> TargetConfig:
    return TargetConfig(vocab_size=vocab, hidden_size=d, intermediate_size=ffn,
                        layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(layers)),
                        num_heads=heads, num_kv_heads=kv, head_dim=hd, rotary_dim=hd // 4, rope_theta=1e4,
                        linear_num_key_heads=lk, linear_num_value_heads=lv, linear_key_head_dim=ldim,
                        linear_value_head_dim=ldim, conv_kernel=4, eos_token_ids=(0,), dtype=dtype)


def full_sizes() -> PairSizes:
    return PairSizes(target=target_config(4096, 256, 768, 8, 4, 2, 64, 4, 8, 32))


def tiny_sizes() -> PairSizes:
    return PairSizes(vocab=320, target=target_config(320, 32, 64, 4, 2, 1, 16, 2, 2, 8), draft_layers=1,
                     draft_heads=2, draft_kv=1, draft_head_dim=16, draft_ffn=64, block=8, taps=(0, 2),
                     t_seq=64, t_batch=8, t_lr=3e-3, t_max_steps=40, prompt_len=16, gen_new=40, gen_n=16,
                     gen_batch=16, d_window=48, d_windows=256, d_batch=8, d_anchors=4, d_lr=3e-3, d_max_steps=40, eval_prompts=2,
                     eval_new=24, budgets=(8, 16), tokenizer_chars=200_000)


def spread_taps(n_layers: int, n_taps: int) -> tuple[int, ...]:
    """Target layers the drafter reads, spread from layer 1 to layer n_layers - 2 (the demo's (1, 4, 6) of 8)."""
    return tuple(sorted({round(1 + i * (n_layers - 3) / max(n_taps - 1, 1)) for i in range(n_taps)}))


def resized(s: PairSizes, width: int | None = None, layers: int | None = None) -> PairSizes:
    """The pair's sizes with a target `width` wide and `layers` deep (None: as is). Heads, GDN key heads and
    the FFN scale with the width (head dims stay), the drafter's width and heads follow the target's (it shares
    its embedding), its taps are spread over the new depth. Refuses sizes the model cannot take, by flag."""
    t = s.target
    width, layers = width or t.hidden_size, layers or t.num_layers
    unit = t.hidden_size // t.num_heads
    if width < unit or width % unit:
        raise ConfigError(f"--target-width {width}: must be a positive multiple of {unit} (the head dim)")
    if layers < 4:
        raise ConfigError(f"--target-layers {layers}: must be at least 4 (every 4th layer is full attention)")
    f = width // unit / t.num_heads                       # the width's multiple of the current one
    heads = width // unit
    kv = max(1, round(t.num_kv_heads * f))
    while heads % kv:
        kv -= 1
    lk = max(1, round(t.linear_num_key_heads * f))
    lv = lk * (t.linear_num_value_heads // t.linear_num_key_heads)
    target = target_config(t.vocab_size, width, 3 * width, layers, heads, kv, t.head_dim, lk, lv,
                           t.linear_key_head_dim, t.dtype)
    taps = s.taps if layers == t.num_layers else spread_taps(layers, len(s.taps))
    dheads = max(1, width // s.draft_head_dim)
    return dataclasses.replace(s, target=target, taps=taps, draft_heads=dheads,
                               draft_kv=max(1, dheads * s.draft_kv // s.draft_heads), draft_ffn=3 * width)


def make_drafter_config(s: PairSizes, tcfg: TargetConfig, mask_id: int, dtype="float32") -> DrafterConfig:
    return DrafterConfig(vocab_size=tcfg.vocab_size, hidden_size=tcfg.hidden_size, intermediate_size=s.draft_ffn,
                         num_heads=s.draft_heads, num_kv_heads=s.draft_kv, head_dim=s.draft_head_dim,
                         layer_types=(FULL,) * s.draft_layers, rope_theta=1e4, target_layer_ids=tuple(s.taps),
                         mask_token_id=mask_id, block_size=s.block, dtype=dtype)


# ------------------------------------------------------------------------------------------------
# Evaluation


def accept_by_depth(hist) -> list[float]:
    """From rounds by tokens emitted (hist[n]: rounds that emitted n = accepted drafts + 1): per draft depth
    d = 1, 2, ..., the share of the rounds that reached depth d whose draft at depth d was accepted,
    P(n >= d + 1 | n >= d); up to the deepest depth some round reached."""
    reach = np.cumsum(np.asarray(hist, np.int64)[::-1])[::-1]          # reach[n] = rounds with >= n tokens
    return [float(reach[d + 1] / reach[d]) for d in range(1, len(reach) - 1) if reach[d] > 0]


CONFIDENCE_BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)


def first_draft_agreement(target: Qwen35, drafter: Drafter, seqs: np.ndarray, start: int):
    """seqs [b, t]: conf [b, t], the target's top-1 probability after each prefix (of token j + 1), and agree
    [b, t - 1 - start]: for each anchor a >= start, whether the drafter's first draft from context
    seqs[:, :a] and anchor seqs[:, a] is seqs[:, a + 1] (what a DFlash round at that point accepts first)."""
    b, t = seqs.shape
    logits, taps, _, _ = target(jnp.asarray(seqs), init_state(target.cfg, b, t), trees.chain(b, t),
                                taps=tuple(drafter.cfg.target_layer_ids), commit_n=_whole(b, t))
    conf = np.asarray(jnp.max(jax.nn.softmax(logits.astype(jnp.float32), -1), -1))
    embed, head = target.embed_tokens[...], target.unembedding()
    graphdef, weights = nnx.split(drafter)

    @jax.jit     # everything as arguments: one compile, no weights or sequences baked in as constants
    def first_draft(weights, taps, seqs, embed, head, a):
        d = nnx.merge(graphdef, weights)
        cache = d.add_context(d.init_cache(b, t), taps, jnp.full((b,), a, jnp.int32))
        return jnp.argmax(d.draft(cache, seqs[:, a], embed, head)[0][:, 0], -1)

    args = (weights, taps, jnp.asarray(seqs), embed, head)
    agree = np.stack([np.asarray(first_draft(*args, jnp.int32(a))) == seqs[:, a + 1] for a in range(start, t - 1)], 1)
    return conf, agree


def greedy_diagnostics(target: Qwen35, drafter: Drafter, prompts: np.ndarray,
                       continuations: list[list[int]]) -> dict:
    """Is it the drafter or the target? Along the target's greedy continuations of the prompts:
    `target_confidence`: the target's top-1 probability of each of its own tokens (mean, median, shares above
    0.9 and at most 0.5): a hesitant target's argmax is hard for any drafter to match. `depth1_agreement`:
    at every position a of the continuations, does the drafter's first draft (context strictly before a,
    block [token a, MASK...]) equal the target's token a + 1: overall and per bin of the target's confidence
    in that token (CONFIDENCE_BINS)."""
    n = min(len(c) for c in continuations)
    if n < 2:
        return {}
    seqs = np.concatenate([prompts, np.asarray([c[:n] for c in continuations], np.int32)], 1)
    p0 = prompts.shape[1]
    conf, agree = first_draft_agreement(target, drafter, seqs, p0)
    c = conf[:, p0:-1]
    gen = conf[:, p0 - 1:-1]
    bins = []
    for lo, hi in zip(CONFIDENCE_BINS[:-1], CONFIDENCE_BINS[1:]):
        m = (c >= lo) & ((c < hi) if hi < 1.0 else (c <= hi))
        bins.append({"p_max": [lo, hi], "share": float(m.mean()), "agree": float(agree[m].mean()) if m.any() else None})
    return {"target_confidence": {"positions": int(gen.size), "mean_p_max": float(gen.mean()),
                                  "median_p_max": float(np.median(gen)), "share_above_0.9": float((gen > 0.9).mean()),
                                  "share_at_most_0.5": float((gen <= 0.5).mean())},
            "depth1_agreement": {"anchors": int(agree.size), "all": float(agree.mean()), "by_target_p_max": bins}}


def repetition(prompts: np.ndarray, continuations: list[list[int]], n: int = 8) -> dict:
    """How much the continuations loop: for each prompt, the share of the n-token windows that end in its
    continuation and occurred earlier in the same sequence (prompt + continuation so far). A target that
    repeats itself is easy to draft for, so a high tau with a high share measures the loop, not the drafter
    (session 21: a target at training loss 1.75 looped, 0.66 of its windows repeated, tau(DFlash) 5.9)."""
    per_prompt = []                                        # None where the continuation ends no window
    for p, c in zip(prompts, continuations):
        seq = [int(x) for x in p] + [int(x) for x in c]
        first = max(len(p) - n + 1, 0)                     # the first window that ends in the continuation
        windows = [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]
        if len(windows) <= first:
            per_prompt.append(None)
            continue
        seen, hits = set(windows[:first]), 0
        for w in windows[first:]:
            hits += w in seen
            seen.add(w)
        per_prompt.append(hits / (len(windows) - first))
    return _window_shares(n, per_prompt)


def _window_shares(n: int, per_prompt: list[float | None]) -> dict:
    """`repetition`'s and `recitation`'s summary of per-prompt window shares (None: no window, left out)."""
    shares = [x for x in per_prompt if x is not None]
    return {"n": n, "mean": float(np.mean(shares)) if shares else 0.0,
            "share_of_prompts_above_half": float(np.mean([s > 0.5 for s in shares])) if shares else 0.0,
            "per_prompt": per_prompt}


def _ngram_hashes(seq: np.ndarray, n: int) -> np.ndarray:
    """uint64 hash of each n-token window of `seq` (polynomial, wrapping): equal windows, equal hashes."""
    seq = np.asarray(seq, np.uint64)
    if len(seq) < n:
        return np.zeros(0, np.uint64)
    h = np.zeros(len(seq) - n + 1, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * np.uint64(1_000_003) + seq[j:len(seq) - n + 1 + j] + np.uint64(1)
    return h


def recitation(prompts: np.ndarray, continuations: list[list[int]], corpus: list[np.ndarray], n: int = 16) -> dict:
    """How much the continuations recite the target's training text: for each prompt, the share of the n-token
    windows that end in its continuation and occur verbatim in one of the `corpus` documents (token ids). A
    target that continues held-out code with text it memorised is easy to draft for once the drafter has memorised
    the same text, so a high tau with a high share measures the memory, not the drafting (session 25: a target at
    training loss 0.05 recited 36.5% / 24.1% of its 16-token windows on the two held-out prompt sets, the shipped
    one 10.5% / 6.2%: bench/results/2026-12-02-h200-s25-pair-stdlib08/recitation.json)."""
    # sorted once, then binary search per window (np.unique / np.isin sort the whole corpus again: ~2 s a call for
    # 1.5 M windows on a 2-core CPU, against ~0.06 s for np.sort)
    known = np.sort(np.concatenate([_ngram_hashes(d, n) for d in corpus] + [np.zeros(0, np.uint64)]))
    per_prompt = []                                        # None where the continuation ends no window
    for p, c in zip(prompts, continuations):
        seq = np.concatenate([np.asarray(p, np.int64), np.asarray(c, np.int64)])
        h = _ngram_hashes(seq, n)[max(len(p) - n + 1, 0):]
        if not len(h):
            per_prompt.append(None)
        elif not len(known):
            per_prompt.append(0.0)
        else:
            at = np.minimum(np.searchsorted(known, h), len(known) - 1)
            per_prompt.append(float((known[at] == h).mean()))
    return _window_shares(n, per_prompt)


LOOPING = 0.3     # mean repeated-window share above which eval warns that tau measures a looping target
QUIET = 0.15      # a prompt whose AR continuation repeats at most this share of its windows counts as not looping
FRESH = 0.25      # ... and as not reciting where at most this share of its windows are in the training text


def tau_where(tau_per_prompt: list[float], rounds_per_prompt: list[int], keep: list[bool]) -> float | None:
    """tau over the prompts `keep` selects (tokens emitted over rounds, as for all prompts); None if none."""
    r = sum(n for n, k in zip(rounds_per_prompt, keep) if k)
    return sum(t * n for t, n, k in zip(tau_per_prompt, rounds_per_prompt, keep) if k) / r if r else None


def first_difference(a, b) -> int | None:
    """The index of the first token where two continuations part (the shorter one's length if one is a prefix of
    the other); None if they are the same."""
    a, b = [int(x) for x in a], [int(x) for x in b]
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def evaluate(target: Qwen35, drafter: Drafter, prompts: np.ndarray, max_new: int, block: int, budgets,
             deadline: float | None = None, detokenize=None, corpus: list[np.ndarray] | None = None,
             ar_rows: int = 1, sampling=None) -> dict:
    """AR, DFlash (chain of `block`) and DDTree at each budget on each prompt (batch 1, greedy, no stop):
    tau, token identity to AR and decode time (timed once every method has compiled, the methods taking turns on
    each prompt). With a non-greedy `sampling` (jaxspec.sampling.Sampling) every method samples instead, prompt i
    with seed i: tau and speed as before, but no identity to AR (speculation keeps AR's distribution, not its
    draws: `identical_to_ar` is None) and no greedy diagnostics.
    Per prompt too (`tau_per_prompt`, `rounds_per_prompt`, and where each prompt's tokens first part from AR's,
    `first_difference_per_prompt`: None where they never do), and tau over the prompts whose AR continuation does
    not loop (`not_looping`: repeated-window share <= QUIET), so that a looping target's tau can be read apart.
    With `detokenize` (token ids -> text), also the characters of the continuations and per round: tau in
    characters, comparable across tokenizers; and AR's continuations as text (`ar.texts`). With `corpus` (the
    target's training documents, token ids), also how much AR's continuations recite it (`ar.recitation`) and tau
    over the prompts whose continuation does not (`not_reciting`: recited-window share <= FRESH). A method whose
    compilation would start past the wall-clock `deadline` is skipped, but AR, DFlash and the first DDTree budget
    always run. With `ar_rows` > 1, AR's step is also run as a tile of that many rows (`engine.AR(ar_rows)`, key
    `ar_rows<R>`): the speculative methods then also say on how many prompts they give its tokens
    (`identical_prompts_to_ar_rows`), for settings under which a 1-row product and a verify's rows do not share
    arithmetic (bench/results/2026-12-03-h200-s35/, `rows/`)."""
    from jaxspec.dflash import DFlash
    from jaxspec.engine import AR, Engine
    from jaxspec.sampling import Sampling
    sampling = sampling or Sampling()
    methods = [("ar", None), ("dflash", None)] + [("ddtree", b) for b in budgets]
    always = set(methods[:3])
    if ar_rows > 1:
        methods.insert(1, ("ar_rows", ar_rows))
        always.add(methods[1])
    max_len = prompts.shape[1] + max_new + max(budgets + (block, ar_rows)) + 2
    engines, compile_s = {}, {}
    for name, budget in methods:
        if deadline is not None and time.time() > deadline and (name, budget) not in always:
            log(f"eval: out of time, skipping {name} {budget or ''}")
            continue
        spec = (None if name == "ar" else AR(budget) if name == "ar_rows"
                else DFlash(drafter, target.cfg, block, budget=budget))
        engines[name, budget] = eng = Engine(target, spec, sampling=sampling, stop_tokens=())
        t0 = time.perf_counter()
        eng.generate([list(map(int, prompts[0]))], max_new, max_len=max_len)          # compile
        compile_s[name, budget] = time.perf_counter() - t0
    # The timed pass runs the methods in turn on each prompt (in a rotating order), so that a machine that slows
    # down or speeds up over minutes shifts every method alike instead of whichever ran then.
    runs = {m: [] for m in engines}
    order = list(engines)
    log(f"eval: timing {len(order)} methods on {len(prompts)} prompts")
    for i, p in enumerate(prompts):
        for m in order[i % len(order):] + order[:i % len(order)]:
            r = engines[m].generate([list(map(int, p))], max_new, max_len=max_len, seed=i)
            runs[m].append((r.tokens[0], r.decode_s, r.hist, r.tau))      # not r.final: the device state
    out, ar_tokens, tile_tokens = {}, None, None
    for (name, budget), rs in runs.items():
        toks = [t for t, _, _, _ in rs]
        decode = sum(d for _, d, _, _ in rs)
        hist = sum(h for _, _, h, _ in rs)
        per_tau = [tau for _, _, _, tau in rs]
        per_rounds = [int(h.sum()) for _, _, h, _ in rs]
        key = name if budget is None else f"ar_rows{budget}" if name == "ar_rows" else f"ddtree_b{budget}"
        rounds = int(hist.sum())
        tau = float((hist * np.arange(len(hist))).sum() / rounds) if rounds else 0.0
        entry = {"tau": tau, "rounds": rounds, "tokens": int(sum(len(t) for t in toks)), "decode_s": decode,
                 "tok_per_s": sum(len(t) for t in toks) / max(decode, 1e-9), "compile_s": compile_s[name, budget],
                 "rounds_by_tokens": [int(x) for x in hist], "accept_by_depth": accept_by_depth(hist),
                 "tau_per_prompt": per_tau, "rounds_per_prompt": per_rounds}
        if detokenize is not None:
            entry["chars"] = sum(len(detokenize([int(x) for x in t])) for t in toks)
            # tau in characters: the continuation's characters a token (the prefill's first token has no
            # round), times tokens a round
            entry["chars_per_round"] = tau * entry["chars"] / max(entry["tokens"], 1)
        if name == "ar":
            ar_tokens = toks
            if detokenize is not None:     # what the target wrote, to read beside the numbers
                entry["texts"] = [detokenize([int(x) for x in t]) for t in toks]
            entry["repetition"] = rep = repetition(prompts, toks)
            if rep["mean"] > LOOPING:
                log(f"eval: WARNING the target loops: {rep['mean']:.0%} of its continuations' {rep['n']}-token "
                    f"windows repeat earlier ones; tau measures the loop more than the drafter")
            if corpus is not None:
                entry["recitation"] = rec = recitation(prompts, toks, corpus)
                log(f"eval: {rec['mean']:.0%} of the target's continuations' {rec['n']}-token windows are in its "
                    f"training text")
            if sampling.greedy:
                entry.update(greedy_diagnostics(target, drafter, prompts, toks))
        else:
            if not sampling.greedy:     # sampled: other draws from the same distribution, nothing to compare
                entry["identical_to_ar"] = entry["identical_prompts"] = None
            else:
                parts = [first_difference(a, b) for a, b in zip(ar_tokens, toks)]
                entry["identical_to_ar"] = all(i is None for i in parts)
                entry["identical_prompts"] = sum(i is None for i in parts)
                entry["first_difference_per_prompt"] = parts  # where each prompt's tokens part from AR's (None: never)
                if detokenize is not None:     # what it wrote instead, so that runs at other settings compare too
                    entry["texts_where_different"] = {str(i): detokenize([int(x) for x in t])
                                                      for i, (t, d) in enumerate(zip(toks, parts)) if d is not None}
            quiet = [x is not None and x <= QUIET for x in out["ar"]["repetition"]["per_prompt"]]
            entry["not_looping"] = {"max_share": QUIET, "prompts": int(sum(quiet)),
                                    "tau": tau_where(per_tau, per_rounds, quiet)}
            if corpus is not None:
                fresh = [x is not None and x <= FRESH for x in out["ar"]["recitation"]["per_prompt"]]
                entry["not_reciting"] = {"max_share": FRESH, "prompts": int(sum(fresh)),
                                         "tau": tau_where(per_tau, per_rounds, fresh)}
            entry["speedup_vs_ar"] = out["ar"]["decode_s"] / max(decode, 1e-9)
            if name == "ar_rows":
                tile_tokens = toks
            elif tile_tokens is not None and sampling.greedy:
                entry["identical_prompts_to_ar_rows"] = sum(a == b for a, b in zip(tile_tokens, toks))
        out[key] = entry
        log(f"eval {key}: tau {tau:.2f}"
            + (f" ({entry['chars_per_round']:.2f} chars/round)" if detokenize is not None else "")
            + f", {entry['tok_per_s']:.1f} tok/s"
            + (f", speedup {entry['speedup_vs_ar']:.2f}x" if name != "ar" else "")
            + (f", identical {entry['identical_to_ar']} ({entry['identical_prompts']}/{len(toks)} prompts)"
               if name != "ar" and sampling.greedy else "")
            + (f"; tau {entry['not_looping']['tau']:.2f} on the {entry['not_looping']['prompts']} prompts that do not "
               f"loop" if name != "ar" and entry["not_looping"]["tau"] is not None else "")
            + (f"; tau {entry['not_reciting']['tau']:.2f} on the {entry['not_reciting']['prompts']} that do not "
               f"recite" if name != "ar" and entry.get("not_reciting", {}).get("tau") is not None else "")
            + (f"; identical to AR as a tile of {ar_rows} rows on {entry['identical_prompts_to_ar_rows']}/{len(toks)}"
               if "identical_prompts_to_ar_rows" in entry else ""))
    return out


# ------------------------------------------------------------------------------------------------
# The end-to-end pipeline


def machine() -> str:
    devs = jax.devices()
    return f"{len(devs)}x {devs[0].device_kind} ({jax.default_backend()}), {os.cpu_count()} CPU cores, {platform.node()}"


# Where each phase of `pair` ends, as fractions of --time-budget-s (each phase may end sooner: the target at its
# step or epoch cap, the data when it is all made). The greedy continuations get 12%: at 4096 prompts a batch
# an H200 makes ~50K of them in a minute, and the drafter needs that many not to memorise them.
PHASE_END = {"target": 0.36, "corpus_mixed": 0.40, "corpus_corpus": 0.46, "greedy": 0.52,
             "drafter": 0.74, "drafter_no_eval": 0.95}


def phase_ends(target_share: float = PHASE_END["target"]) -> dict:
    """PHASE_END with the target's phase ending at `target_share` of the budget and the later phases squeezed
    (or stretched) proportionally into what is left before 0.95, where the drafter of --no-eval ends.
    Session 21: at the default share the target trained only ~2 of the 9 minutes of a call (the rest went to
    a drafter that d_more.sh then retrains), and at 2.4 passes over 17 M tokens its greedy text looped."""
    t0, end = PHASE_END["target"], PHASE_END["drafter_no_eval"]
    if not t0 / 2 <= target_share < end - 0.05:
        raise ValueError(f"must be in [{t0 / 2:g}, {end - 0.05:g}), the share of the budget where the target "
                         f"stops training (default {t0:g})")
    scale = (end - target_share) / (end - t0)
    return {k: target_share + (v - t0) * scale for k, v in PHASE_END.items()}


# The demo pair is kept in the repository, whose files must be at most 16 MB each (issue #8): a drafter larger than
# this is exported in shards (the target's are 10 MiB).
REPO_FILE_BYTES = 15 * 2**20


def run_pair(args) -> int:
    from convert.hf import load_target
    from jaxspec.export import export_drafter, export_target, staged_dir
    from jaxspec.plot import loss_curve_png

    t_start = time.time()
    budget = float(args.time_budget_s)
    at = lambda frac: t_start + frac * budget
    try:
        ends = phase_ends(args.target_share)
    except ValueError as e:
        raise ConfigError(f"--target-share {args.target_share:g}: {e}") from None
    refuse_below(0, ("--target-max-epochs", args.target_max_epochs, "no cap"),
                 ("--ckpt-every", args.ckpt_every, "a checkpoint only at each phase's end"),
                 ("--package-text", args.package_text))
    check_seed(args.seed)
    refuse_below(1, ("--part-mb", args.part_mb), ("--gen-sequences", args.gen_sequences),
                 ("--gen-batch", args.gen_batch), ("--drafter-layers", args.drafter_layers),
                 ("--target-width", args.target_width), ("--target-layers", args.target_layers))
    if not (math.isfinite(budget) and budget > 0):
        raise ConfigError(f"--time-budget-s {budget:g}: must be > 0 (the wall-clock budget of all the phases)")
    s = resized(tiny_sizes() if args.tiny else full_sizes(), args.target_width, args.target_layers)
    if args.vocab is not None:
        if args.vocab < MIN_VOCAB:
            raise ConfigError(f"--vocab {args.vocab}: must be >= {MIN_VOCAB} (the 256 byte tokens and "
                              f"{MIN_VOCAB - 256} special ones)")
        s = dataclasses.replace(s, vocab=args.vocab)
    s = dataclasses.replace(s, gen_n=args.gen_sequences or s.gen_n, gen_batch=args.gen_batch or s.gen_batch,
                            draft_layers=args.drafter_layers or s.draft_layers)
    unseen = args.drafter_prompts == "unseen"
    n_pkg = args.package_text
    try:
        target_pkgs = package_files(n_pkg, part="target") if n_pkg else []
        prompt_pkgs = package_files(n_pkg, part="prompts") if n_pkg and unseen else []
    except ValueError as e:
        raise ConfigError(f"--package-text {n_pkg}: {e}") from None
    out = out_dir(args.out, "--out", checkpoints=not args.work)
    work = out_dir(args.work, "--work", checkpoints=True) if args.work else out / "work"
    out.mkdir(parents=True, exist_ok=True)
    pair = work / "pair"
    tdir, ddir = pair / "target", pair / "drafter"
    git = git_info()
    results = {"commit": git["commit"], "dirty": git["dirty"], "machine": machine(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "tiny": bool(args.tiny), "time_budget_s": budget, "jax": jax.__version__,
               "target_size": {"hidden_size": s.target.hidden_size, "layers": s.target.num_layers,
                               "heads": s.target.num_heads, "linear_key_heads": s.target.linear_num_key_heads}}
    log(f"pair: {results['machine']}; budget {budget:.0f}s; work dir {work}")

    # 1. Corpus and tokenizer.
    files = stdlib_files()
    if args.tiny:
        files = files[:120]
    train_files, held_files, prompt_files = pair_files(files, unseen, target_pkgs, prompt_pkgs)
    texts, n_chars = [], 0
    for f in train_files:
        t = read_text(f)
        if t:
            texts.append(t)
            n_chars += len(t)
    tok_texts, c = [], 0
    for t in np.random.default_rng(args.seed).permutation(np.array(texts, dtype=object)):
        tok_texts.append(t)
        c += len(t)
        if c >= s.tokenizer_chars:
            break
    tok = train_tokenizer(tok_texts, s.vocab)
    vocab = tok.get_vocab_size()
    eos_id, mask_id = tok.token_to_id(EOS_TOKEN), tok.token_to_id(MASK_TOKEN)
    docs = [np.asarray(e.ids, np.int32) for e in tok.encode_batch(texts)]
    stream = np.concatenate([np.concatenate([d, [eos_id]]) for d in docs]).astype(np.int32)
    held_docs = encode_files(tok, held_files)
    # the drafter's greedy prompts: from the target's own training text, or from files it never saw
    prompt_docs = encode_files(tok, prompt_files) if unseen else docs
    root = Path(sysconfig.get_paths()["stdlib"])
    rel = lambda fs: [n for n in map(stdlib_name, fs) if n is not None]
    results["corpus"] = {"source": "Python standard library .py files (PSF license) at " + str(root)
        + (", and .py files of the installed packages" if n_pkg else ""),
        "python": platform.python_version(), "train_files": len(train_files),
        "held_out_files": len(held_files), "train_chars": n_chars, "train_tokens": int(len(stream)),
        "vocab": vocab, "held_out_tokens": int(sum(len(d) for d in held_docs)),
        "drafter_prompts": args.drafter_prompts,
        "drafter_prompt_files": len(prompt_files) if unseen else len(train_files),
        "drafter_prompt_tokens": int(sum(len(d) for d in prompt_docs)),
        "package_files": {"target": len(target_pkgs), "drafter_prompts": len(prompt_pkgs)},
        # the stdlib files by name, so that a later evaluation elsewhere can check that its prompts are unseen
        "stdlib_files": {"train": rel(train_files), "held_out": rel(held_files), "drafter_prompts": rel(prompt_files)}}
    log(f"corpus: {len(train_files)} files ({len(target_pkgs)} from installed packages), {n_chars / 1e6:.1f}M "
        f"chars -> {len(stream) / 1e6:.2f}M tokens (vocab {vocab}); held out {len(held_files)} files; the drafter's "
        f"prompts: {results['corpus']['drafter_prompt_files']} files")
    tcfg = s.target.replace(vocab_size=vocab, eos_token_ids=(eos_id,))
    # What shapes the run: a rerun into the same --work resumes a phase's checkpoint only with the same flags.
    flags = {"--tiny": bool(args.tiny), "--seed": args.seed, "--target-width": tcfg.hidden_size,
             "--target-layers": tcfg.num_layers, "--vocab": vocab, "--package-text": n_pkg,
             "--drafter-prompts": args.drafter_prompts, "--target-max-epochs": args.target_max_epochs,
             "the corpus (its tokens)": array_digest(stream)}

    # 2. Target.
    target = Qwen35(tcfg, rngs=nnx.Rngs(args.seed))
    graphdef, params = nnx.split(target)
    tr = Trainer(target_loss(graphdef), params, (), stream_batches(stream, s.t_batch, s.t_seq, args.seed),
                 steps=s.t_max_steps, opt=OptConfig(lr=s.t_lr, warmup=min(200, s.t_max_steps // 10)),
                 ckpt_dir=work / "ckpt_target", ckpt_every=args.ckpt_every, name="target", config=flags,
                 new_run="--out (or --work)")
    cap = s.t_max_steps
    if args.target_max_epochs:     # steps that show the target its training stream at most this many times
        cap = min(cap, max(int(args.target_max_epochs * len(stream) / (s.t_batch * s.t_seq)), 1))
    # Once the drafter phase has a checkpoint the target is final: a rerun (a new deadline) that trained a target cut
    # short by its deadline further would have the resumed drafter continue against another target.
    restored = tr.restore()
    drafter_begun = newest_meta(work / "ckpt_drafter", "--out (or --work)") is not None
    if drafter_begun and not restored:     # a new target would only have the drafter's checkpoint refused after it
        raise ConfigError(f"{work / 'ckpt_drafter'} holds a drafter trained against a target whose checkpoints are "
                          f"not in {work / 'ckpt_target'}; pass a new --out (or --work) to start another pair")
    if drafter_begun:
        log(f"target: kept at step {tr.step}/{tr.steps}: the drafter phase has begun (checkpoints in "
            f"{work / 'ckpt_drafter'}); pass a new --out (or --work) to train another target")
    else:
        if not restored:
            tr.steps = calibrate_steps(tr, at(ends["target"] - 0.02) - time.time(), cap=cap)
            tr.warmup = min(200, max(tr.steps // 10, 1))
        tr.run(deadline=at(ends["target"]))
    target = nnx.merge(graphdef, jax.device_get(tr.params))
    results["target"] = {"config": dataclasses.asdict(tcfg), "steps": tr.step, "tokens_seen": tr.step * s.t_batch * s.t_seq,
                         "epochs": tr.step * s.t_batch * s.t_seq / len(stream), "max_epochs": args.target_max_epochs,
                         "share_of_budget": args.target_share,
                         "final_loss": float(np.mean(tr.losses[-20:])),
                         "params": int(sum(x.size for x in jax.tree.leaves(params)))}
    loss_curve_png(out / "target_loss.png", tr.losses)
    export_dtype = "float32" if args.tiny else "bfloat16"
    with staged_dir(tdir) as tmp:        # the previous export stays whole until this one is
        export_target(rebuild(Qwen35, tcfg.replace(dtype=export_dtype), tr.params), tmp)
        save_tokenizer(tok, tmp)
    # Everything downstream uses the target exactly as shipped: read back from the exported files.
    target = load_target(tdir, dtype=args.eval_dtype)
    log(f"target: {tr.step} steps, loss {results['target']['final_loss']:.3f}; exported to {tdir}")

    # 3. The drafter's training data.
    data = args.drafter_data or s.d_data
    dcfg = make_drafter_config(s, tcfg, mask_id, dtype="float32")
    frozen_target = load_target(tdir, dtype="float32")
    t0 = time.time()
    results["drafter_data"] = {"source": data}
    if data in ("corpus", "mixed"):
        cache = FeatureCache(work / "features")
        win = s.prompt_len + s.gen_new if data == "mixed" else s.d_window   # mixed: one batch shape
        n_win = len(stream) // win if not s.d_windows else min(s.d_windows, len(stream) // win)
        done = cache.build(frozen_target, stream, tuple(s.taps), win, n_win, args.seed + 1,
                           batch=s.gen_batch // 4 or 1, deadline=at(ends["corpus_" + data]),
                           extend=not drafter_begun)      # the drafter's checkpoints were trained on these windows
        positions = win - s.block - (s.prompt_len - 1) + 1
        results["drafter_data"]["corpus"] = {"windows": done, "window": win, "tokens": done * win,
                                             "labels": "target greedy, exact prefix", "seconds": time.time() - t0}
        log(f"data: target features for {done} windows of {win} tokens in {time.time() - t0:.1f}s")
    if data in ("greedy", "mixed"):
        t1 = time.time()
        prompts = prompts_from(prompt_docs, s.gen_n, s.prompt_len, args.seed + 1)
        seqs = greedy_sequences(frozen_target, prompts, s.gen_new, s.gen_batch, work / "greedy.npy",
                                deadline=at(ends["greedy"]), extend=not drafter_begun)
        results["drafter_data"]["greedy"] = {"sequences": int(len(seqs)), "prompt_len": s.prompt_len,
                                             "generated": s.gen_new, "seconds": time.time() - t1}
        log(f"data: {len(seqs)} greedy continuations of {s.gen_new} tokens in {time.time() - t1:.1f}s")
        # their features too, so that a step never runs the target
        gcache = FeatureCache(work / "greedy_features")
        n_seq = gcache.build(frozen_target, seqs.reshape(-1), tuple(s.taps), seqs.shape[1], len(seqs),
                             args.seed + 5, batch=s.gen_batch // 4 or 1)
        g_positions = s.gen_new - s.block + 2
        if data == "greedy":
            cache, done, positions = gcache, n_seq, g_positions

    # 4. Drafter: to the end of the budget, less the evaluation's share when there is one.
    d_end = ends["drafter_no_eval" if args.no_eval else "drafter"]
    drafter = Drafter(dcfg, rngs=nnx.Rngs(args.seed + 2))
    dgraph, dparams = nnx.split(drafter)
    loss_fn = drafter_loss_cached(dgraph, default_gamma(s.block))
    frozen = {"embed": frozen_target.embed_tokens[...], "lm_head": frozen_target.unembedding()}
    epochs_at = lambda steps: epochs_seen(steps, s.d_batch, s.d_anchors, done, positions)
    if data != "mixed":
        batches = cached_batches(cache, done, s.d_batch, s.block, s.d_anchors, s.prompt_len - 1, args.seed + 3)
    else:   # s.d_greedy_frac of each batch from the greedy continuations
        ng = min(max(round(s.d_batch * s.d_greedy_frac), 1), s.d_batch - 1)
        batches = mixed_batches(
            cached_batches(cache, done, s.d_batch - ng, s.block, s.d_anchors, s.prompt_len - 1, args.seed + 3),
            cached_batches(gcache, n_seq, ng, s.block, s.d_anchors, s.prompt_len - 1, args.seed + 6))
        epochs_at = lambda steps: max(epochs_seen(steps, s.d_batch - ng, s.d_anchors, done, positions),
                                      epochs_seen(steps, ng, s.d_anchors, n_seq, g_positions))
    dtr = Trainer(loss_fn, dparams, frozen, batches,
                  steps=s.d_max_steps, opt=OptConfig(lr=s.d_lr, warmup=min(200, s.d_max_steps // 10)),
                  ckpt_dir=work / "ckpt_drafter", ckpt_every=args.ckpt_every, name="drafter",
                  config={**flags, "--drafter-data": data, "--drafter-layers": s.draft_layers,
                          # a drafter checkpoint made against other target weights is refused, never trained on
                          "the target (its weights)": model_fingerprint(frozen_target),
                          # and one made on other data (a cache made again): the sequences its batches draw from
                          "the drafter's data (sequences)": [done, n_seq] if data == "mixed" else [done]},
                  new_run="--out (or --work)")
    if not dtr.restore():
        dtr.steps = calibrate_steps(dtr, at(d_end - 0.02) - time.time(), cap=s.d_max_steps)
        dtr.warmup = min(200, max(dtr.steps // 25, 1))
    epochs = epochs_at(dtr.steps)
    warn_epochs("drafter", epochs, s.d_max_epochs)
    results["drafter_data"]["epochs"] = epochs
    dtr.run(deadline=at(d_end))
    loss_curve_png(out / "drafter_loss.png", dtr.losses)
    with staged_dir(ddir) as tmp:
        export_drafter(rebuild(Drafter, dcfg.replace(dtype=export_dtype), dtr.params), tmp,
                       num_target_layers=tcfg.num_layers, max_shard_bytes=REPO_FILE_BYTES)
    results["drafter"] = {"config": dataclasses.asdict(dcfg), "steps": dtr.step, "gamma": default_gamma(s.block),
                          "anchors_per_seq": s.d_anchors, "final_loss": float(np.mean(dtr.losses[-20:])),
                          "params": int(sum(x.size for x in jax.tree.leaves(dparams)))}
    log(f"drafter: {dtr.step} steps, loss {results['drafter']['final_loss']:.3f}; exported to {ddir}")

    # 5. Held-out evaluation, on the exported files.
    if args.no_eval:
        results["eval"] = {"skipped": "--no-eval (run `python -m jaxspec.train eval` on the unpacked pair)"}
    else:
        evaluate_pair(results, s, args, held_docs, docs, tdir, ddir, t_start + budget)
    results["wall_s"] = time.time() - t_start
    for d in (out, pair):
        write_atomic(d / "results.json", json.dumps(results, indent=2) + "\n")
    for png in ("target_loss.png", "drafter_loss.png"):
        shutil.copyfile(out / png, pair / png)
    pack(pair, out, part_bytes=args.part_mb * 2**20)
    log(f"pair: done in {results['wall_s']:.0f}s; results in {out / 'results.json'}")
    return 0


def evaluate_pair(results, s, args, held_docs, train_docs, tdir, ddir, deadline):
    """The pair's held-out evaluation (results["eval"]), on its exported files, until `deadline`; recitation
    measured against the target's training documents `train_docs`."""
    from convert.drafter import load_drafter
    from convert.hf import load_target
    from jaxspec.tokenizer import load_tokenizer

    eval_prompts = prompts_from(held_docs, s.eval_prompts, s.prompt_len, args.seed + 4)
    target = load_target(tdir, dtype=args.eval_dtype)
    drafter = load_drafter(ddir, dtype=args.eval_dtype)
    results["eval"] = {"prompts": int(len(eval_prompts)), "prompt_len": s.prompt_len, "max_new_tokens": s.eval_new,
                       "dtype": args.eval_dtype, "greedy": True, "batch": 1, "block": s.block,
                       "matmul_precision": "highest"}
    with jax.default_matmul_precision("highest"):
        results["eval"]["methods"] = evaluate(target, drafter, eval_prompts, s.eval_new, s.block, tuple(s.budgets),
                                              deadline=deadline, detokenize=load_tokenizer(tdir).decode,
                                              corpus=train_docs)


def rebuild(cls, cfg, params):
    """`cls(cfg)` holding `params` (the state of a model of the same shapes) cast to cfg.dtype, on the host."""
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, jax.tree.map(lambda x: np.asarray(x).astype(cfg.jnp_dtype), jax.device_get(params)))


PACK_SUMS = "pair.sha256"     # the parts' digests, written last


def pack(pair: Path, out: Path, part_bytes: int) -> list[Path]:
    """pair/ -> out/pair.tar.00, .01, ... (each <= part_bytes); `cat pair.tar.* | tar -x` restores it. The parts are
    written whole in a temporary sibling dir first: the previous ones are replaced (and those left over removed) only
    once all the new ones are complete. out/pair.sha256 (`sha256sum -c` format) lists the parts: it is removed before
    the first part is replaced and written again after the last, so a set that a crash left mixed has none."""
    if part_bytes < 1:
        raise ValueError(f"part_bytes must be >= 1, got {part_bytes}")
    with tempfile.TemporaryDirectory(prefix=".pair-parts-", dir=out) as tmp:
        tmp = Path(tmp)
        with tarfile.open(tmp / "pair.tar", "w") as tf:    # not what a killed write left (`staged_dir`)
            tf.add(pair, arcname="demo", filter=lambda m: None if is_leftover(Path(m.name).name) else m)
        data = (tmp / "pair.tar").read_bytes()
        (tmp / "pair.tar").unlink()
        new = []
        for i in range(0, len(data), part_bytes):
            new.append(tmp / f"pair.tar.{i // part_bytes:02d}")
            new[-1].write_bytes(data[i:i + part_bytes])
        sums = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in new)
        (out / PACK_SUMS).unlink(missing_ok=True)
        for p in new:
            os.replace(p, out / p.name)
        for old in out.glob("pair.tar.*"):
            if old.name not in {p.name for p in new}:
                old.unlink()
        write_atomic(out / PACK_SUMS, sums)
    return [out / p.name for p in new]


# ------------------------------------------------------------------------------------------------
# `drafter`: a drafter for an existing target


def check_val_sequences(n_val: int, n: int, batch: int) -> None:
    """Refuse --val-sequences that leave fewer than --batch of the data's n sequences to train on."""
    if n_val and n_val > n - batch:
        raise ConfigError(f"--val-sequences {n_val}: the data has {n} sequences, and --batch {batch} of them "
                          f"must be left to train on")


def target_tokenizer(path):
    """--target's tokenizer; one that cannot be read is the flag's error, not a traceback."""
    from jaxspec.tokenizer import load_tokenizer
    try:
        return load_tokenizer(path)
    except ValueError as e:
        raise ConfigError(f"--target {path}: {e}") from None


def refuse_below(low: int, *checks) -> None:
    """A ConfigError naming the first flag whose value is below `low` (or not finite); checks are (flag, value) or
    (flag, value, what 0 means); a value of None (not given) passes."""
    for flag, v, *zero in checks:
        if v is not None and not (math.isfinite(v) and v >= low):
            raise ConfigError(f"{flag} {v:g}: must be " + ("" if math.isfinite(v) else "a finite number ")
                              + f">= {low}" + (f" (0: {zero[0]})" if zero else ""))


MAX_SEED = 2**32 - 1     # the commands derive seeds up to --seed + 6; numpy and JAX take any of them


def check_seed(seed: int) -> None:
    """A ConfigError for a --seed outside 0..MAX_SEED (past 2**63, JAX's key would overflow mid-run)."""
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed {seed}: must be >= 0 and <= {MAX_SEED}")


def check_drafter_flags(args) -> None:
    """`drafter`'s numeric flags, refused before any model is read: a ConfigError naming the flag and its value."""
    refuse_below(1, ("--steps", args.steps), ("--batch", args.batch), ("--gen-batch", args.gen_batch),
                 ("--anchors", args.anchors), ("--window", args.window), ("--sequences", args.sequences),
                 ("--prompt-len", args.prompt_len), ("--gen-new", args.gen_new), ("--layers", args.layers),
                 ("--heads", args.heads), ("--kv-heads", args.kv_heads), ("--head-dim", args.head_dim),
                 ("--n-taps", args.n_taps), ("--ffn", args.ffn))
    refuse_below(0, ("--windows", args.windows, "all of the text"),
                 ("--ckpt-every", args.ckpt_every, "a checkpoint only at the end"),
                 ("--time-budget-s", args.time_budget_s, "no budget"),
                 ("--max-epochs", args.max_epochs), ("--grow-layers", args.grow_layers),
                 ("--package-text", args.package_text), ("--shard-mb", args.shard_mb),
                 ("--val-sequences", args.val_sequences))
    check_seed(args.seed)
    if args.block < 2:
        raise ConfigError(f"--block {args.block}: must be >= 2 (the anchor and at least one token to draft)")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ConfigError(f"--lr {args.lr:g}: must be > 0")
    if args.gamma is not None and not (math.isfinite(args.gamma) and args.gamma > 0):
        raise ConfigError(f"--gamma {args.gamma:g}: must be > 0 (leave it out for the block's default)")
    if args.mask_token_id < 0:
        raise ConfigError(f"--mask-token-id {args.mask_token_id}: must be >= 0")
    if any(t < 0 for t in args.taps or ()):
        raise ConfigError(f"--taps {' '.join(map(str, args.taps))}: layer ids must be >= 0")
    twice = sorted({t for t in args.taps or () if args.taps.count(t) > 1})
    if twice:
        raise ConfigError(f"--taps {' '.join(map(str, args.taps))}: layer {twice[0]} is listed twice (each target "
                          f"layer can be tapped once)")


def check_room(args, block: int) -> None:
    """Each training sequence must hold --anchors blocks of `block` tokens anchored after its first --prompt-len - 1
    tokens (the context every block sees): corpus windows of --window tokens, greedy sequences of --prompt-len +
    --gen-new. Refused naming the flag and the least it may be."""
    room = f"for --anchors {args.anchors} blocks of {block} tokens after the first --prompt-len - 1 = " \
           f"{args.prompt_len - 1} tokens"
    if args.data == "corpus" and args.window < block + args.anchors + args.prompt_len - 2:
        raise ConfigError(f"--window {args.window}: too short {room}; the least is "
                          f"{block + args.anchors + args.prompt_len - 2}")
    if args.data == "greedy" and args.gen_new < block + args.anchors - 2:
        raise ConfigError(f"--gen-new {args.gen_new}: too short {room}; the least is {block + args.anchors - 2}")


def out_dir(path, flag: str, *, checkpoints: bool = False) -> Path:
    """`path` (absolute), refused by a ConfigError naming `flag` when it, or the nearest of its parents that exists,
    is not a directory; with `checkpoints` (Orbax writes under it), also where Orbax cannot write."""
    path = Path(path).absolute()
    p = blocking_file(path)
    if p is not None:
        raise ConfigError(f"{flag} {path}: {'it' if p == path else p} is a file, not a directory")
    problem = orbax_path_problem(path) if checkpoints else None
    if problem:
        raise ConfigError(f"{flag} {path}: {problem}")
    return path


def model_dir(path, flag: str) -> Path:
    """`path`, a model dir to read, refused by a ConfigError naming `flag` when it does not exist or is not a
    directory."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{flag} {path}: does not exist")
    if not path.is_dir():
        raise ConfigError(f"{flag} {path}: is not a directory (expected a model dir)")
    return path


N_TAPS = 3       # drafter --n-taps's default


def run_drafter(args) -> int:
    from convert.store import load_model
    from jaxspec.export import export_drafter
    from jaxspec.plot import loss_curve_png

    check_drafter_flags(args)
    if args.grow_layers and not args.init:
        raise ConfigError("--grow-layers needs --init (the drafter to grow)")
    if 0 < args.val_sequences < args.batch:
        raise ConfigError(f"--val-sequences {args.val_sequences}: must be 0 or at least --batch ({args.batch}), "
                          f"the held-out loss being measured a whole batch at a time")
    if not 0.0 <= args.soft_labels <= 1.0:
        raise ConfigError(f"--soft-labels must be in [0, 1], got {args.soft_labels}")
    if args.soft_labels and args.features != "live":
        raise ConfigError(f"--soft-labels {args.soft_labels} needs --features live: the feature cache keeps the "
                          f"target's greedy token, not its distribution")
    if not args.init:
        check_room(args, args.block)
    out = out_dir(args.out, "--out", checkpoints=True)
    try:
        text = list(args.text) + (package_files(args.package_text, part="prompts") if args.package_text else [])
    except ValueError as e:
        raise ConfigError(f"--package-text {args.package_text}: {e}") from None
    files = text_files(text)
    t_start = time.time()
    target = load_model(model_dir(args.target, "--target"), dtype="float32")
    docs = text_docs(target_tokenizer(args.target), files)
    if not docs:
        raise ConfigError(f"--text: the files hold no text ({len(files)} files, each empty or unreadable)")
    log(f"data: {len(docs)} text files ({sum(map(len, docs)) / 1e6:.2f} M tokens)"
        + (f", {args.package_text} of them from installed packages" if args.package_text else ""))
    n_layers, vocab = target.cfg.num_layers, target.cfg.vocab_size
    check_vocabulary(docs, vocab, args.target)
    if args.init:
        # Continue from an existing drafter: its own architecture, taps and block; the shape flags are unused.
        from convert.drafter import load_draft
        from jaxspec.drafter_config import check_pair
        drafter = load_draft(model_dir(args.init, "--init"), dtype="float32")
        check_pair(drafter.cfg, target.cfg)
        check_room(args, drafter.cfg.block_size)
        init_weights = model_fingerprint(drafter)
        if args.grow_layers:
            drafter = grow_drafter(drafter, args.grow_layers, args.seed)
        dcfg, taps, args.block = drafter.cfg, tuple(drafter.cfg.target_layer_ids), drafter.cfg.block_size
        log(f"drafter: starting from {args.init} (taps {taps}, block {args.block}"
            + (f"; {args.grow_layers} identity layers appended: {dcfg.num_layers} layers)" if args.grow_layers else ")"))
    else:
        init_weights = None
        bad = [t for t in args.taps or () if not 0 <= t < n_layers]
        if bad:
            raise ConfigError(f"--taps {' '.join(map(str, args.taps))}: {bad[0]} is not a layer of the target "
                              f"(layers 0..{n_layers - 1})")
        if not 0 <= args.mask_token_id < vocab:
            raise ConfigError(f"--mask-token-id {args.mask_token_id}: outside the target's vocabulary (0..{vocab - 1})")
        most = len(spread_taps(n_layers, n_layers))       # distinct layers between the first and the last two
        if not args.taps and args.n_taps is not None and args.n_taps > most:
            raise ConfigError(f"--n-taps {args.n_taps}: the target's {n_layers} layers give at most {most} distinct "
                              f"taps spread over its depth (--taps may name any of layers 0..{n_layers - 1})")
        taps = tuple(args.taps) if args.taps else spread_taps(n_layers, args.n_taps or min(N_TAPS, most))
        try:
            dcfg = DrafterConfig(vocab_size=vocab, hidden_size=target.cfg.hidden_size,
                                 intermediate_size=args.ffn or 3 * target.cfg.hidden_size, num_heads=args.heads,
                                 num_kv_heads=args.kv_heads, head_dim=args.head_dim, layer_types=(FULL,) * args.layers,
                                 rope_theta=target.cfg.rope_theta, target_layer_ids=taps,
                                 mask_token_id=args.mask_token_id, block_size=args.block, dtype="float32")
        except ConfigError as e:
            raise ConfigError(f"the drafter's shape (--layers --heads --kv-heads --head-dim --ffn): {e}") from None
        drafter = Drafter(dcfg, rngs=nnx.Rngs(args.seed))
    if args.data == "corpus":
        tokens = sum(len(d) + 1 for d in docs)
        if tokens < args.window:
            raise ConfigError(f"--text: {tokens} tokens in all, shorter than one window (--window {args.window})")
    else:
        try:
            prompts = prompts_from(docs, args.sequences, args.prompt_len, args.seed)
        except ValueError as e:
            raise ConfigError(f"--text: {e} (--prompt-len {args.prompt_len})") from None
    # the sequences the data will hold, known before any is made (greedy data takes hours at real sizes)
    check_val_sequences(args.val_sequences, min(args.windows or tokens // args.window, tokens // args.window)
                        if args.data == "corpus" else len(prompts), args.batch)
    gamma = args.gamma if args.gamma is not None else default_gamma(args.block)
    # What shapes the run: a rerun into the same --out resumes its checkpoint only with the same (Trainer.restore);
    # the shape's values are the drafter's own (with --init, its; the unused flags may change).
    text_ids = np.concatenate([np.r_[len(d), d] for d in docs]).astype(np.int64)     # each document's length, ids
    config = {"--target (its weights)": model_fingerprint(target), "--text (its tokens)": array_digest(text_ids),
              "--init (its weights)": init_weights, "--grow-layers": args.grow_layers, "--block": dcfg.block_size,
              "--layers": dcfg.num_layers, "--heads": dcfg.num_heads, "--kv-heads": dcfg.num_kv_heads,
              "--head-dim": dcfg.head_dim, "--ffn": dcfg.intermediate_size, "--taps": list(taps),
              "--mask-token-id": dcfg.mask_token_id, "--gamma": gamma, "--data": args.data,
              "--features": args.features, "--prompt-len": args.prompt_len,
              **({"--window": args.window, "--windows": args.windows} if args.data == "corpus" else
                 {"--sequences": args.sequences, "--gen-new": args.gen_new}),
              "--stream-labels": args.stream_labels, "--val-sequences": args.val_sequences,
              "--soft-labels": args.soft_labels, "--batch": args.batch, "--anchors": args.anchors, "--lr": args.lr,
              "--seed": args.seed}
    prev = newest_meta(out / "ckpt")
    if prev is not None:            # refused before the data is made, not after
        refuse_other_config(out / "ckpt", prev, config)
        if args.steps < prev["step"]:
            raise ConfigError(f"--steps {args.steps}: the run in {out} is at step {prev['step']} already; pass "
                              f"--steps >= {prev['step']}, or a new --out to start another run")
    out.mkdir(parents=True, exist_ok=True)
    live = args.features == "live"
    cache = seqs = None
    if args.data == "corpus":
        eos = (target.cfg.eos_token_ids or (0,))[0]
        stream = np.concatenate([np.concatenate([d, [eos]]) for d in docs]).astype(np.int32)
        n_all = len(stream) // args.window
        n_windows = min(args.windows or n_all, n_all)
        if live:
            seqs = np.stack([stream[s:s + args.window] for s in corpus_windows(stream, args.window, args.seed)[:n_windows]])
        else:
            cache = FeatureCache(out / "features")
            cache.build(target, stream, taps, args.window, n_windows, args.seed, batch=args.gen_batch)
        positions = args.window - args.block - (args.prompt_len - 1) + 1
        what = f"windows of {args.window} tokens"
    else:
        # The target's own greedy path after each prompt (saved as made). Its features are then cached on disk
        # (--features cache: a training step never runs the target) or made inside each step (live).
        seqs = greedy_sequences(target, prompts, args.gen_new, args.gen_batch, out / "greedy.npy")
        if not live:
            cache = FeatureCache(out / "greedy_features")
            cache.build(target, seqs.reshape(-1), taps, seqs.shape[1], len(seqs), args.seed,
                        batch=max(args.gen_batch // 4, 1))
        positions = args.gen_new - args.block + 2
        what = f"greedy continuations of {args.gen_new} tokens"
    done = len(seqs) if live else cache.done
    log(f"data: {done} {what}, " + ("target features made in each step" if live else "target features cached"))
    n_val = args.val_sequences
    check_val_sequences(n_val, done, args.batch)
    n_train = done - n_val
    dgraph, dparams = nnx.split(drafter)
    frozen = {"embed": target.embed_tokens[...], "lm_head": target.unembedding()}
    lo = args.prompt_len - 1
    if live:
        tgraph, frozen["target"] = nnx.split(target)
        loss_fn = drafter_loss_live(dgraph, tgraph, taps, gamma, exact=not args.stream_labels, soft=args.soft_labels)
        # the held-out loss stays the greedy labels' cross-entropy, comparable between runs with and without
        eval_fn = drafter_loss_live(dgraph, tgraph, taps, gamma, exact=not args.stream_labels)
        batches = drafter_batches(seqs[:n_train], lo, args.batch, args.block, args.anchors, args.seed + 1)
        rows = lambda idx: {"tokens": seqs[n_train + idx].astype(np.int32)}
        width = seqs.shape[1]
    else:
        loss_fn = eval_fn = drafter_loss_cached(dgraph, gamma, exact=not args.stream_labels)
        batches = cached_batches(cache, n_train, args.batch, args.block, args.anchors, lo, args.seed + 1)
        arrays = cache.arrays()
        rows = lambda idx: {k: np.asarray(a[n_train + idx]) for k, a in zip(("tokens", "greedy", "taps"), arrays)}
        width = arrays[0].shape[1]
    held_out = held_out_batches(rows, n_val, width, args.batch, args.block, args.anchors, lo, args.seed + 2)
    warn_epochs("drafter", epochs_seen(args.steps, args.batch, args.anchors, n_train, positions), args.max_epochs)
    tr = Trainer(loss_fn, dparams, frozen, batches,
                 steps=args.steps, opt=OptConfig(lr=args.lr, warmup=max(1, int(0.04 * args.steps))),
                 ckpt_dir=out / "ckpt", ckpt_every=args.ckpt_every, name="drafter", eval_loss_fn=eval_fn,
                 config=config, steps_asked=args.steps)
    resumed = tr.restore()
    if resumed and tr.steps_asked is not None and tr.steps_asked != args.steps:
        # Another --steps than the run was started with: its schedule becomes that of an --steps run from the step
        # reached on (warm-up as it was), so a finished run trains on to the new total.
        log(f"drafter: --steps {tr.steps_asked} -> {args.steps}: training on from step {tr.step} to {args.steps} "
            f"on the schedule of a {args.steps}-step run")
        tr.steps = tr.steps_asked = args.steps
    deadline = t_start + args.time_budget_s if args.time_budget_s else None
    val = []

    def held_out_loss():
        if n_val:
            val.append([tr.step, tr.evaluate(held_out())])
            log(f"drafter: held-out loss {val[-1][1]:.4f} at step {tr.step} ({n_val // args.batch * args.batch} "
                f"sequences never trained on)")
    held_out_loss()
    if deadline is not None and not resumed:
        if deadline - time.time() <= 0:     # nothing saved yet: a rerun reuses the data and trains
            raise ConfigError(f"--time-budget-s {args.time_budget_s:g}: making the data took all of it "
                              f"({time.time() - t_start:.0f}s), no time is left to train; the data is kept in "
                              f"{out}: rerun with a larger --time-budget-s, or none")
        # Fit the schedule to the time left (keeping ~5% for the export), so that it completes its decay.
        tr.steps = calibrate_steps(tr, 0.95 * (deadline - time.time()), cap=args.steps)
        tr.warmup = max(1, int(0.04 * tr.steps))
    tr.run(deadline=deadline)
    held_out_loss()
    loss_curve_png(out / "drafter_loss.png", tr.losses)
    export_drafter(rebuild(Drafter, dcfg.replace(dtype=args.dtype), tr.params), out / "drafter",
                   num_target_layers=n_layers, max_shard_bytes=args.shard_mb * 2**20 if args.shard_mb else None)
    if val:
        tmp = out / "val_loss.json.tmp"
        tmp.write_text(json.dumps({"sequences": n_val, "features": args.features, "soft_labels": args.soft_labels,
                                   "loss": "greedy-label cross-entropy", "loss_at_step": val}))
        os.replace(tmp, out / "val_loss.json")
    log(f"drafter: {tr.step} steps, loss {np.mean(tr.losses[-20:]):.4f}"
        + (f", held-out {val[0][1]:.4f} -> {val[-1][1]:.4f}" if val else "") + f"; wrote {out / 'drafter'}")
    return 0


TEXT_SUFFIXES = (".py", ".txt", ".md")


def text_files(paths) -> list[Path]:
    """The files among `paths` (files, or dirs searched for .py/.txt/.md), in order."""
    files = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"--text {p}: no such file or directory")
        found = sorted(q for q in p.rglob("*") if q.is_file() and q.suffix in TEXT_SUFFIXES) if p.is_dir() else [p]
        if not found:
            raise ConfigError(f"--text {p}: the directory holds no {', '.join(TEXT_SUFFIXES)} files")
        files += found
    return files


def text_docs(tok, paths) -> list[np.ndarray]:
    """Token ids of each non-empty text file among `paths` (files, or dirs searched for .py/.txt/.md), in order."""
    return [np.asarray(tok.encode(t), np.int32) for t in (read_text(f) for f in text_files(paths)) if t]


def stdlib_names(results) -> dict:
    """`corpus.stdlib_files` of a `pair` run's results.json: lists of file names under "train" and
    "drafter_prompts"; a ValueError saying what is missing or of the wrong kind."""
    corpus = results.get("corpus") if isinstance(results, dict) else None
    names = corpus.get("stdlib_files") if isinstance(corpus, dict) else None
    if names is None:
        raise ValueError("it has no corpus.stdlib_files (a results.json of an older jaxspec, or not of `pair`)")
    for part in ("train", "drafter_prompts"):
        if not isinstance(names, dict) or not isinstance(names.get(part), list):
            raise ValueError(f"its corpus.stdlib_files has no list {part!r} (a results.json not written by `pair`)")
    return names


def seen_by_pair(files: list[Path], results: dict, stdlib_root=None) -> list[Path]:
    """Those of `files` that a `pair` run (its results.json, `results`) trained its target on or cut its drafter's
    prompts from, by their path under the stdlib (`corpus.stdlib_files`), wherever that stdlib is installed."""
    names = stdlib_names(results)
    seen = set(names["train"]) | set(names["drafter_prompts"])
    return [f for f in files if stdlib_name(f, stdlib_root) in seen]


def trained_on(results: dict, stdlib_root=None) -> tuple[list[Path], int]:
    """The stdlib files a `pair` run (its results.json) trained its target on that this machine has, and how many
    it lists (another Python may lack a few). Package files are not named in results.json, so not among them."""
    names = stdlib_names(results)
    root = Path(stdlib_root or sysconfig.get_paths()["stdlib"])
    listed = sorted(set(names["train"]))
    return [root / n for n in listed if (root / n).is_file()], len(listed)


def check_vocabulary(docs, vocab: int, target) -> None:
    """Refuse token ids the target's vocabulary does not hold (a tokenizer larger than the model): the target would
    clamp them, a drafter's embedding lookup give NaN."""
    top = max((int(d.max()) for d in docs if len(d)), default=-1)
    if top >= vocab:
        raise ConfigError(f"--target {target}: its tokenizer gives token id {top} (a vocabulary of at least "
                          f"{top + 1}), but the model's vocabulary has {vocab} tokens (ids 0..{vocab - 1}); the "
                          f"tokenizer files must be those the target was trained with")


def run_eval(args) -> int:
    from convert.drafter import load_draft
    from convert.store import load_model

    from jaxspec.sampling import Sampling, cut_problem
    refuse_below(1, ("--prompts", args.prompts), ("--prompt-len", args.prompt_len), ("--max-new", args.max_new),
                 ("--budgets", min(args.budgets, default=1)), ("--ar-rows", args.ar_rows))
    check_seed(args.seed)
    try:
        sampling = Sampling(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if problem := cut_problem(sampling):        # was: a greedy run, the cut silently unused
        raise ConfigError(problem)
    if Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out}: is a directory; eval writes a JSON file")
    out_dir(Path(args.out).absolute().parent, "--out")
    files, left_out, trained, listed = text_files(args.text), [], None, 0
    if args.unseen_by:
        try:
            pair_results = json.loads(Path(args.unseen_by).read_text())
            left_out = set(seen_by_pair(files, pair_results))
            trained, listed = trained_on(pair_results)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"--unseen-by {args.unseen_by}: not valid JSON ({e})") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"--unseen-by {args.unseen_by}: {e}") from None
        files = [f for f in files if f not in left_out]
        log(f"eval: {len(left_out)} of {len(files) + len(left_out)} text files left out: the pair of "
            f"{args.unseen_by} trained on them or drafted from them")
        if not files:
            raise ConfigError(f"--unseen-by {args.unseen_by}: every --text file was seen by that pair")
    target = load_model(model_dir(args.target, "--target"), dtype=args.dtype)
    if args.draft_dtype is None:
        from jaxspec.dflash import default_draft_dtype
        args.draft_dtype = default_draft_dtype(jax.default_backend(), args.dtype)
    drafter = load_draft(model_dir(args.draft, "--draft"), dtype=args.draft_dtype)
    tok = target_tokenizer(args.target)
    corpus = None
    if trained is not None:
        corpus = text_docs(tok, trained)
        log(f"eval: recitation measured against {len(trained)} of the {listed} stdlib files the target trained on "
            f"({sum(map(len, corpus)) / 1e6:.2f} M tokens)")
    docs = text_docs(tok, files)
    check_vocabulary(docs, target.cfg.vocab_size, args.target)
    try:
        prompts = prompts_from(docs, args.prompts, args.prompt_len, args.seed)
    except ValueError as e:
        raise ConfigError(f"--text: {e} (--prompt-len {args.prompt_len})") from None
    from jaxspec.dflash import block_size_for
    block = block_size_for(drafter.cfg, args.block_size)        # refused here, before any method compiles
    precision = args.matmul_precision or ("highest" if args.dtype == "float32" else "default")
    with jax.default_matmul_precision(precision):
        methods = evaluate(target, drafter, prompts, args.max_new, block, tuple(args.budgets),
                           detokenize=tok.decode, corpus=corpus, ar_rows=args.ar_rows, sampling=sampling)
    git = git_info()
    result = {"what": "held-out evaluation of a target + DFlash drafter (python -m jaxspec.train eval): "
                      + ("greedy" if sampling.greedy else "sampled (prompt i with seed i)")
                      + ", batch 1, no stop; tau = tokens committed per verify round",
              "sampling": dataclasses.asdict(sampling),
              "commit": git["commit"], "dirty": git["dirty"], "machine": machine(), "jax": jax.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "flags": dispatch.flags(),
              "target": str(args.target), "draft": str(args.draft), "dtype": args.dtype,
              "draft_dtype": args.draft_dtype, "matmul_precision": precision, "ar_rows": args.ar_rows,
              "block_size": block,
              "prompts": {"n": args.prompts, "len": args.prompt_len, "seed": args.seed, "max_new": args.max_new,
                          "text": [str(t) for t in args.text],
                          **({"unseen_by": str(args.unseen_by), "left_out": sorted(map(str, left_out)),
                              "recitation_corpus": {"stdlib_files_found": len(trained), "stdlib_files_listed": listed,
                                                    "package_files_not_included": pair_results["corpus"].get(
                                                        "package_files", {}).get("target", 0)}}
                             if args.unseen_by else {})},
              "methods": methods}
    out = Path(args.out)
    write_atomic(out, json.dumps(result, indent=1))
    log(f"eval: wrote {out}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxspec.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)     # its metavar, set below, names the commands
    a = sub.add_parser("pair", help="train the demo target + DFlash drafter end to end and evaluate them")
    a.add_argument("--out", required=True, help="output dir: pair.tar.NN parts, pair.sha256, results.json, loss PNGs")
    a.add_argument("--work", help="scratch dir for checkpoints and the unpacked pair (default: OUT/work)")
    a.add_argument("--time-budget-s", type=float, default=480,
                   help="wall-clock budget of all the phases, > 0 (default: %(default)s)")
    a.add_argument("--tiny", action="store_true", help="toy sizes: runs end to end on a CPU in about a minute")
    a.add_argument("--seed", type=int, default=0,
                   help="seed of the data, weights and prompts, 0..2**32-1 (default: %(default)s)")
    a.add_argument("--ckpt-every", type=int, default=500,
                   help="checkpoint every N steps of each training phase, 0: only at its end; a rerun with the same "
                        "flags resumes (default: %(default)s)")
    a.add_argument("--eval-dtype", default="float32", choices=("float32", "bfloat16"),
                   help="dtype of the models in the held-out evaluation (default: %(default)s)")
    a.add_argument("--drafter-data", choices=("mixed", "corpus", "greedy"), default=None,
                   help="drafter training data: the target teacher-forced over the corpus, its greedy continuations "
                        "of prompts, or both (mixed, the default)")
    a.add_argument("--part-mb", type=int, default=15, help="size of each pair.tar part (default: %(default)s MiB)")
    a.add_argument("--target-width", type=int, default=None,
                   help="the target's hidden size (default: 256, --tiny 32; heads, GDN heads and FFN scale with it, "
                        "the drafter follows); a wider target writes more confident continuations for the drafter to "
                        "learn")
    a.add_argument("--target-layers", type=int, default=None,
                   help="the target's layers, >= 4 (default: 8, --tiny 4)")
    a.add_argument("--vocab", type=int, default=None,
                   help="the byte-level BPE's vocabulary (default: 4096, --tiny 320; >= 258). A smaller one raises tau "
                        "in tokens but not in characters (1024 tokens: 6.16 characters a DFlash round against 6.32, "
                        "bench/results/2026-12-01-h200-s17-pair-v1024); compare pairs by eval's chars_per_round")
    a.add_argument("--drafter-prompts", choices=("unseen", "train"), default="unseen",
                   help="where the drafter's greedy prompts come from: files set apart from both the target's "
                        "training split and the evaluation (unseen, the default: the target free-running on text "
                        "new to it, as it will at inference), or the target's training files (train: it recites)")
    a.add_argument("--target-share", type=float, default=PHASE_END["target"],
                   help="the share of --time-budget-s at which the target stops training (default: %(default)s); "
                        "the data and drafter phases share what is left before 95%% in their default proportions. "
                        "Raise it when a later call trains the drafter further (bench/next/d_more.sh)")
    a.add_argument("--target-max-epochs", type=float, default=0,
                   help="train the target over its stream at most this many times (default: 0, no cap; the "
                        "384-wide target memorised its split in 16 epochs, loss 0.19)")
    a.add_argument("--gen-sequences", type=int, default=None,
                   help="greedy continuations of the target to train the drafter on (default: 49152, --tiny 16; "
                        "fewer if the greedy phase's share of the budget runs out first)")
    a.add_argument("--gen-batch", type=int, default=None,
                   help="prompts continued at once while making them (default: 4096, --tiny 16)")
    a.add_argument("--drafter-layers", type=int, default=None, help="the drafter's layers (default: 2, --tiny 1)")
    a.add_argument("--package-text", type=int, default=0, metavar="N",
                   help="N .py files of this interpreter's installed packages for the target to train on, from "
                        "their 'target' half, and (with the default --drafter-prompts unseen) N of the 'prompts' "
                        "half, the one `drafter --package-text` reads, among the drafter's prompts; the held-out "
                        "evaluation stays on the stdlib (default: 0, none)")
    a.add_argument("--no-eval", action="store_true",
                   help="skip the held-out evaluation (run `jaxspec.train eval` later); the drafter gets its time")
    a.set_defaults(func=run_pair)
    d = sub.add_parser("drafter", help="train (or continue, --init) a DFlash drafter for an existing target")
    d.add_argument("--target", required=True, help="target dir (HF or converted) with tokenizer files")
    d.add_argument("--text", nargs="+", required=True,
                   help="text files or dirs (.py/.txt/.md) of the training data: with --data corpus (the default), "
                        "the corpus the target is teacher-forced over in --window windows; with --data greedy, the "
                        "text the --sequences prompts are cut from")
    d.add_argument("--package-text", type=int, default=0, metavar="N",
                   help="also N .py files of this interpreter's installed packages (1-100 KB each, evenly spaced "
                        "over their sorted list) as text: more varied prompts than a few held-apart files. They come "
                        "from the packages' 'prompts' half, which `pair --package-text` never trains its target on "
                        "(default: 0, none)")
    d.add_argument("--out", required=True, help="writes OUT/drafter (z-lab layout), OUT/ckpt, OUT/drafter_loss.png")
    d.add_argument("--block", type=int, default=16,
                   help="block size B: the anchor and B - 1 drafted tokens, >= 2 (default: %(default)s)")
    d.add_argument("--layers", type=int, default=2, help="the drafter's layers (default: %(default)s)")
    d.add_argument("--heads", type=int, default=4, help="its attention heads (default: %(default)s)")
    d.add_argument("--kv-heads", type=int, default=2,
                   help="its key/value heads, a divisor of --heads (default: %(default)s)")
    d.add_argument("--head-dim", type=int, default=64, help="its head dim, even (default: %(default)s)")
    d.add_argument("--ffn", type=int, default=None, help="MLP width (default: 3 x hidden)")
    d.add_argument("--n-taps", type=int, default=None,
                   help=f"target layers to tap, spread over layers 1..L-2 of its L, at most L - 2, unless --taps "
                        f"(default: {N_TAPS}, or L - 2 where that is fewer)")
    d.add_argument("--taps", type=int, nargs="*", help="target layer ids to tap (default: --n-taps spread uniformly)")
    d.add_argument("--mask-token-id", type=int, required=True,
                   help="the token id filling a block's drafted slots: one of the target's vocabulary (required; "
                        "unused with --init, which keeps its own)")
    d.add_argument("--gamma", type=float, default=None,
                   help="loss decay, > 0 (default: 7 for B=16, 5 for 10, 4 for 8, else 7 B / 16)")
    d.add_argument("--init", help="start from this drafter (z-lab layout or converted) instead of a new one; "
                                  "its architecture, taps and block are kept and the shape flags are unused")
    d.add_argument("--grow-layers", type=int, default=0,
                   help="with --init: append this many layers, each starting as the identity (zero output "
                        "projections), so training starts from the --init drafter's own drafts (default: 0)")
    d.add_argument("--data", choices=("corpus", "greedy"), default="corpus",
                   help="corpus (default): the target teacher-forced over windows of the text, labels its own "
                        "greedy predictions (features cached in OUT/features); greedy: its greedy continuations "
                        "of --sequences prompts cut from the text (saved to OUT/greedy.npy as they are made, "
                        "features cached in OUT/greedy_features; slow to make, easy to overfit)")
    d.add_argument("--features", choices=("cache", "live"), default="cache",
                   help="cache (default): the target's features for all the data made once and kept on disk "
                        "(OUT/features, OUT/greedy_features; ~0.6 MB a sequence at width 384); live: made inside "
                        "each training step, nothing on disk, so the data can be many more sequences than the disk "
                        "holds features for (each step then runs the target's forward too)")
    d.add_argument("--val-sequences", type=int, default=0, metavar="N",
                   help="set the last N sequences (or windows) of the data apart and report the loss on them before "
                        "and after training (OUT/val_loss.json): the held-out loss, unlike the training loss, shows "
                        "when the drafter starts to memorise its data (default: 0, none)")
    d.add_argument("--soft-labels", type=float, default=0.0, metavar="ALPHA",
                   help="with --features live: weight in [0, 1] of the target's whole next-token distribution in "
                        "each block slot's loss, the greedy token's cross-entropy keeping 1 - ALPHA (default: 0, the "
                        "greedy token alone, as DFlash trains). The held-out loss stays the greedy token's")
    d.add_argument("--window", type=int, default=256, help="corpus: window length (default: %(default)s)")
    d.add_argument("--windows", type=int, default=0, help="corpus: windows to use (default: all of the text)")
    d.add_argument("--stream-labels", action="store_true",
                   help="keep block slots after the text leaves the target's greedy path (default: masked)")
    d.add_argument("--max-epochs", type=float, default=20.0,
                   help="warn above this many passes over the data (default: %(default)s)")
    d.add_argument("--sequences", type=int, default=1024,
                   help="greedy: prompts cut from the text and continued (default: %(default)s)")
    d.add_argument("--prompt-len", type=int, default=64,
                   help="greedy: tokens per prompt; either data: anchors come after the first --prompt-len - 1 "
                        "tokens of a sequence (default: %(default)s)")
    d.add_argument("--gen-new", type=int, default=192,
                   help="greedy: tokens the target generates per prompt (default: %(default)s)")
    d.add_argument("--gen-batch", type=int, default=256,
                   help="sequences the target runs at once while making the data (default: %(default)s)")
    d.add_argument("--batch", type=int, default=32, help="sequences per training step (default: %(default)s)")
    d.add_argument("--anchors", type=int, default=16,
                   help="blocks (random anchor positions) per sequence (default: %(default)s)")
    d.add_argument("--steps", type=int, default=2000,
                   help="training steps (default: %(default)s). A rerun into the same --out resumes; with another "
                        "--steps it trains on to that many, on the schedule of a run of that many steps")
    d.add_argument("--lr", type=float, default=6e-4,
                   help="peak learning rate, > 0: linear warm-up over the first 4%% of --steps, then cosine decay "
                        "to 10%% of the peak at the last step; AdamW with beta2 0.95, weight decay 0.01 (matrices "
                        "only) and gradients clipped to global norm 1.0 (default: %(default)s)")
    d.add_argument("--ckpt-every", type=int, default=200,
                   help="checkpoint (OUT/ckpt) every N steps, 0: only at the end; a rerun with the same flags "
                        "resumes from the latest, one with flags that shape the run otherwise is refused (default: "
                        "%(default)s)")
    d.add_argument("--time-budget-s", type=float, default=None,
                   help="wall-clock budget of the whole command: a fresh run times a few steps after the data is "
                        "ready and sets its step count (at most --steps) so that the schedule ends in time; "
                        "a resumed run keeps its own and stops at the budget (default: none; 0: none)")
    d.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"),
                   help="dtype of the exported drafter; it trains in float32 (default: %(default)s)")
    d.add_argument("--shard-mb", type=int, default=0, metavar="N",
                   help="export the drafter in safetensors shards of at most N MiB with an index, when it is larger "
                        "(e.g. 15 for a repository that takes files of <= 16 MB; default: 0, one model.safetensors "
                        "as z-lab's drafters are)")
    d.add_argument("--seed", type=int, default=0,
                   help="seed of the weights, windows, prompts and batches, 0..2**32-1 (default: %(default)s)")
    d.set_defaults(func=run_drafter)
    e = sub.add_parser("eval", help="tau, identity to AR and speed of a target + drafter on prompts cut from text")
    e.add_argument("--target", required=True, help="target dir (HF or converted) with tokenizer files")
    e.add_argument("--draft", required=True, help="DFlash drafter dir (z-lab layout or converted)")
    e.add_argument("--text", nargs="+", required=True, help="held-out text files or dirs (.py/.txt/.md)")
    e.add_argument("--out", required=True, help="results JSON to write")
    e.add_argument("--prompts", type=int, default=16, help="prompts cut from the text (default: %(default)s)")
    e.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt (default: %(default)s)")
    e.add_argument("--max-new", type=int, default=128, help="tokens generated per prompt (default: %(default)s)")
    e.add_argument("--budgets", type=int, nargs="*", default=[16, 32, 64], help="DDTree budgets (default: %(default)s)")
    e.add_argument("--seed", type=int, default=4, help="which prompts, 0..2**32-1 (default: %(default)s)")
    e.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="the target's dtype (default: %(default)s)")
    e.add_argument("--draft-dtype", default=None, choices=("float32", "bfloat16"),
                   help="the drafter's dtype (default: bfloat16 under a float32 target on a GPU, else --dtype). It "
                        "only proposes and the target checks every token, so a bfloat16 drafter under a float32 "
                        "target leaves the output identical to AR")
    e.add_argument("--matmul-precision", default=None, choices=MATMUL_PRECISIONS, metavar="P",
                   help="jax.default_matmul_precision for every method alike (AR included): 'highest' (full fp32 "
                        "products), 'tensorfloat32', 'default', or a jax.lax.DotAlgorithmPreset name such as "
                        "BF16_BF16_F32_X6 (default: 'highest' with --dtype float32, else 'default')")
    e.add_argument("--ar-rows", type=int, default=1,
                   help="also run AR's step as a tile of this many rows (the root and copies of it that are never "
                        "accepted), as a verify sees its rows, and count the prompts on which each speculative method "
                        "gives that AR's tokens (default: %(default)s, plain AR only). For --matmul-precision "
                        "settings under which a 1-row product differs from a verify's rows")
    e.add_argument("--temperature", type=float, default=0.0,
                   help="sample every method at this temperature, prompt i with seed i (default: 0, greedy). Sampled "
                        "runs give tau and speed but no identity to AR: speculation keeps AR's distribution, not its "
                        "draws")
    e.add_argument("--top-k", type=int, default=0,
                   help="with --temperature: keep the k most likely tokens (default: 0, off)")
    e.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus mass (default: 1.0, off)")
    e.add_argument("--block-size", type=int, default=None,
                   help="the drafter's block: DFlash verifies a chain of this many tokens and DDTree's trees are at "
                        "most this deep minus one (default: the block it was trained with)")
    e.add_argument("--unseen-by", metavar="RESULTS_JSON",
                   help="a `pair` run's results.json: leave out the --text files of the stdlib that its target "
                        "trained on or its drafter's prompts came from (their names are in corpus.stdlib_files); "
                        "and measure how much the target's continuations recite the files it trained on (those this "
                        "Python has): ar.recitation, and tau where a prompt's continuation does not (not_reciting)")
    e.set_defaults(func=run_eval)
    sub.metavar = "{" + ",".join(sub.choices) + "}"      # without a command: "required: {pair,drafter,eval}", not "cmd"
    return p


def main(argv=None) -> int:
    from convert.hf import CheckpointError
    args = parser().parse_args(argv)
    claim_device_memory()
    try:
        dispatch.check_flags()               # before any work: a misspelt JAXSPEC_* flag would choose nothing
        dispatch.check_gpu_flags()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except (ConfigError, CheckpointError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except FloatingPointError as e:          # a non-finite loss: the checkpoints before it are kept, none after
        fix = ("rerun with a lower --lr and a new --out" if args.cmd == "drafter" else
               "rerun with another --seed and a new --out (or --work)")
        print(f"error: {e}; the checkpoints before it are kept; {fix}", file=sys.stderr)
        return 2
    except Interrupted as e:                 # Ctrl-C or SIGTERM while training: the trainer saved a checkpoint first
        print(e, file=sys.stderr)
        return 128 + int(e.signum)          # as a shell reports a process ended by the signal: 130, 143
    except KeyboardInterrupt:                # Ctrl-C elsewhere (data, export: each resumes or is written whole)
        print("interrupted; " + ("eval keeps no checkpoints: rerun it to start over" if args.cmd == "eval" else
                                 "rerun the same command to resume from its last checkpoint"), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
