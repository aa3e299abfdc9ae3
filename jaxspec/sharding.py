"""Tensor and data parallelism on a `jax.sharding.Mesh` with axes ("data", "model").

One table (`RULES`) maps logical axes to mesh axes; weights declare their logical axes once
(`PARAM_AXES`, by module and leaf name), the decoding state likewise (`STATE_AXES`). The model runs
under GSPMD: jit with `NamedSharding` params and state, each matmul sharded on heads / MLP columns /
vocabulary, two all-reduces per layer (after o_proj or out_proj, after down_proj). Pallas kernels run
per shard through `per_shard` (shard_map), which needs the mesh set (`jax.set_mesh`) while tracing.

Layout for a tensor-parallel degree `tp` (the model's own layout at tp = 1 is the same):
- attention: the fused q|k|v kernel (jaxspec/model.py `FUSED`) holds per kv head its query heads' q|gate
  columns, then its k and v columns, so it splits by kv heads; kv heads split when tp divides them, else
  each kv head is repeated tp / kv times at load (`tp_config`), with its query heads shared out among the
  copies, so that every shard holds the kv heads its q heads read;
- GDN: the q|k|v channels are stored in key-head-group order (convert/keys.py), and the fused qkv|z|b|a
  kernel per key-head group, so whole groups (key head, its value heads) split `tp` ways for any tp
  dividing linear_num_key_heads; A_log, dt_bias, out_proj rows and the recurrent state follow the value heads;
- MLP: intermediate split (the fused gate|up kernel holds each channel's two columns side by side);
- vocabulary: embedding rows and lm_head columns split, padded to a multiple of tp
  (`TargetConfig.padded_vocab`) with the padded logits -inf, so argmax, sampling and top-k over the
  sharded vocabulary are those of the unpadded one.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxspec.config import ConfigError

DATA, MODEL = "data", "model"

# The one table: logical axis -> mesh axis (None: replicated).
RULES: dict[str, str | None] = {
    "batch": DATA,
    "heads": MODEL,       # attention query heads
    "kv_heads": MODEL,    # attention (and drafter) kv heads, repeated up to tp at load when fewer
    "gdn": MODEL,         # GDN key-head groups with their value heads
    "mlp": MODEL,         # MLP intermediate
    "vocab": MODEL,       # embedding rows, lm_head columns, logits
    "embed": None,        # the residual stream
    "length": None, "head_dim": None, "window": None,
}

# Weights: (module, leaf) -> logical axes of the leaf. Anything not listed is replicated (norms, the
# drafter's fc, the MTP head's fc). The MTP head's decoder layer shards like the target's. The target's
# fused kernels (jaxspec/model.py `FUSED`) group their columns by what they split on; their parts, as the
# checkpoint stores them (and the drafter's own projections), are listed too: a load reads those.
PARAM_AXES: dict[tuple[str, str], tuple[str | None, ...]] = {
    ("embed_tokens", ""): ("vocab", "embed"),
    ("lm_head", "kernel"): ("embed", "vocab"),
    ("gate_up_proj", "kernel"): ("embed", "mlp"),
    ("qkv_proj", "kernel"): ("embed", "kv_heads"),
    ("in_proj", "kernel"): ("embed", "gdn"),
    ("q_proj", "kernel"): ("embed", "heads"),
    ("k_proj", "kernel"): ("embed", "kv_heads"),
    ("v_proj", "kernel"): ("embed", "kv_heads"),
    ("o_proj", "kernel"): ("heads", "embed"),
    ("gate_proj", "kernel"): ("embed", "mlp"),
    ("up_proj", "kernel"): ("embed", "mlp"),
    ("down_proj", "kernel"): ("mlp", "embed"),
    ("in_proj_qkv", "kernel"): ("embed", "gdn"),
    ("in_proj_z", "kernel"): ("embed", "gdn"),
    ("in_proj_b", "kernel"): ("embed", "gdn"),
    ("in_proj_a", "kernel"): ("embed", "gdn"),
    ("conv1d", ""): ("window", "gdn"),
    ("dt_bias", ""): ("gdn",),
    ("A_log", ""): ("gdn",),
    ("out_proj", "kernel"): ("gdn", "embed"),
}

# Decoding state (jaxspec.model.State, jaxspec.drafter.DrafterCache): field -> logical axes per leaf.
STATE_AXES: dict[str, tuple[str | None, ...]] = {
    "length": ("batch",),
    "keys": ("batch", "length", "kv_heads", "head_dim"),
    "values": ("batch", "length", "kv_heads", "head_dim"),
    "conv": ("batch", "window", "gdn"),
    "ssm": ("batch", "gdn", "head_dim", "head_dim"),
}

def spec(axes) -> P:
    return P(*(RULES[a] if a else None for a in axes))


def param_axes(path: tuple) -> tuple[str | None, ...] | None:
    """Logical axes of the parameter at `path` (an NNX state path), None when it is replicated."""
    names = [str(p) for p in path]
    leaf = names[-1]
    for module, name in ((names[-2] if len(names) > 1 else "", leaf), (leaf, "")):
        if (module, name) in PARAM_AXES:
            return PARAM_AXES[(module, name)]
    return None


def param_spec(path: tuple, ndim: int) -> P:
    axes = param_axes(path)
    if axes is None or len(axes) != ndim:
        return P()
    return spec(axes)


# ------------------------------------------------------------------------------------------------ mesh


def make_mesh(tp: int = 1, dp: int = 1, devices=None) -> Mesh:
    """A (dp, tp) mesh over the first dp * tp devices (all processes' devices under jax.distributed)."""
    if tp < 1 or dp < 1:
        raise ConfigError(f"--tp {tp} --dp {dp}: degrees must be >= 1")
    devices = list(jax.devices() if devices is None else devices)
    if dp * tp > len(devices):
        raise ConfigError(f"--tp {tp} --dp {dp} needs {tp * dp} devices, but {len(devices)} are visible "
                          f"({devices[0].platform})")
    grid = np.array(devices[:dp * tp], dtype=object).reshape(dp, tp)
    return Mesh(grid, (DATA, MODEL), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def check_mesh(mesh) -> Mesh:
    """`mesh` itself when jaxspec can shard on it: a Mesh with axes ("data", "model"), both of type Auto (the
    model runs under GSPMD: with jax.make_mesh's Explicit axes the kernels' shard_map specs do not match, and
    other axis names have no rule). Else a ConfigError naming what was found."""
    fix = "build it with jaxspec.sharding.make_mesh(tp, dp)"
    if not isinstance(mesh, Mesh):
        raise ConfigError(f"mesh must be a jax.sharding.Mesh with axes {(DATA, MODEL)}, got {type(mesh).__name__}; "
                          f"{fix}")
    if tuple(mesh.axis_names) != (DATA, MODEL):
        raise ConfigError(f"the mesh has axes {tuple(mesh.axis_names)} (shape {dict(mesh.shape)}), but jaxspec "
                          f"shards on axes {(DATA, MODEL)} in that order; {fix}")
    types = tuple(getattr(mesh, "axis_types", None) or ())
    if any(t != jax.sharding.AxisType.Auto for t in types):
        raise ConfigError(f"the mesh's axes {(DATA, MODEL)} have types {tuple(t.name for t in types)} (jax.make_mesh "
                          f"gives Explicit ones), but jaxspec needs AxisType.Auto for both; {fix} (or pass "
                          f"axis_types=(jax.sharding.AxisType.Auto,) * 2)")
    return mesh


def tp_degree(mesh: Mesh | None) -> int:
    return 1 if mesh is None else check_mesh(mesh).shape[MODEL]


def dp_degree(mesh: Mesh | None) -> int:
    return 1 if mesh is None else check_mesh(mesh).shape[DATA]


def _divides(tp: int, pairs, what: str):
    for field, value in pairs:
        if value % tp:
            raise ConfigError(f"--tp {tp} does not divide the {what}: {field}={value} is not a multiple of {tp}")


def check_target(cfg, tp: int) -> None:
    """ConfigError naming the config.json field when `tp` cannot shard the target."""
    _divides(tp, (("num_attention_heads", cfg.num_heads), ("linear_num_key_heads", cfg.linear_num_key_heads),
                  ("intermediate_size", cfg.intermediate_size)), "model")
    kv = cfg.num_kv_heads
    if kv % tp and tp % kv:
        raise ConfigError(f"--tp {tp} does not fit the model: num_key_value_heads={kv} must divide or be a "
                          f"multiple of {tp} (kv heads are split, or repeated when fewer than {tp})")


def check_drafter(cfg, tp: int) -> None:
    _divides(tp, (("num_attention_heads", cfg.num_heads), ("intermediate_size", cfg.intermediate_size)),
             "DFlash drafter")
    kv = cfg.num_kv_heads
    if kv % tp and tp % kv:
        raise ConfigError(f"--tp {tp} does not fit the DFlash drafter: num_key_value_heads={kv} must divide or "
                          f"be a multiple of {tp}")


def tp_config(cfg, tp: int):
    """The config a tp-way shard layout runs: kv heads repeated up to tp, vocabulary padded to a multiple of
    tp (target configs only). The identity for tp = 1."""
    kw = {}
    if tp > cfg.num_kv_heads:
        kw["num_kv_heads"] = tp
    if hasattr(cfg, "padded_vocab") and not getattr(cfg, "padded_vocab") and cfg.vocab_size % tp:
        kw["padded_vocab"] = -(-cfg.vocab_size // tp) * tp
    return cfg.replace(**kw) if kw else cfg


def tp_index(path: tuple, cfg, tp: int) -> tuple[int, np.ndarray] | None:
    """How the tp layout of the parameter at `path` reads the unsharded one: (axis, source index per
    position, -1 for padding), or None where they are the same."""
    names = [str(p) for p in path]
    module = names[-2] if len(names) > 1 else ""
    if module in ("k_proj", "v_proj", "qkv_proj") and tp > cfg.num_kv_heads:
        r, hd = tp // cfg.num_kv_heads, cfg.head_dim
        heads = np.repeat(np.arange(cfg.num_kv_heads), r)          # kv head j of the tp layout is j // r
        kv = (heads[:, None] * hd + np.arange(hd)[None]).reshape(-1)
        if module != "qkv_proj":
            return 1, kv
        # The fused q|k|v kernel: column ids of its parts, fused in both layouts, give where each column comes from.
        from jaxspec.model import fuse_kernels, part_widths
        wq, wk, _ = part_widths(cfg, "qkv_proj")
        q, k, v = np.arange(wq), wq + np.arange(wk), wq + wk + np.arange(wk)
        ids = fuse_kernels(cfg, "qkv_proj", [q[None], k[None], v[None]])[0]
        ids_tp = fuse_kernels(tp_config(cfg, tp), "qkv_proj", [q[None], k[kv][None], v[kv][None]])[0]
        return 1, np.argsort(ids)[ids_tp]
    if hasattr(cfg, "padded_vocab") and cfg.vocab_size % tp:
        rows = -(-cfg.vocab_size // tp) * tp
        idx = np.where(np.arange(rows) < cfg.vocab_size, np.arange(rows), -1)
        if names[-1] == "embed_tokens":
            return 0, idx
        if module == "lm_head":
            return 1, idx
    return None


def take_index(x, axis: int, idx: np.ndarray):
    """x gathered along `axis` at idx, zeros where idx is -1 (jnp or np)."""
    lib = jnp if isinstance(x, jax.Array) else np
    out = lib.take(x, np.maximum(idx, 0), axis=axis)
    if (idx < 0).any():
        shape = [1] * out.ndim
        shape[axis] = len(idx)
        out = lib.where(np.asarray(idx >= 0).reshape(shape), out, lib.zeros((), out.dtype))
    return out


def from_tp_layout(src, tp: int, flat: dict) -> dict | None:
    """`flat` ({param path: host array} in the tp layout of the config `src`) in `src`'s own layout, the inverse of
    `tp_index`; None where a position that `tp_index` says is a copy of another is not identical to it."""
    out = dict(flat)
    for path, x in flat.items():
        m = tp_index(path, src, tp)
        if m is None:
            continue
        axis, idx = m
        pos = np.flatnonzero(idx >= 0)
        _, first = np.unique(idx[pos], return_index=True)     # where each source index first appears
        out[path] = np.take(x, pos[first], axis=axis)
        if len(first) < len(pos):                               # copies: each must be what it copies
            back = np.ascontiguousarray(np.take(out[path], idx[pos], axis=axis))
            held = np.ascontiguousarray(np.take(x, pos, axis=axis))
            if not np.array_equal(back.view(np.uint8), held.view(np.uint8)):
                return None
    return out


# ------------------------------------------------------------------------------------------------ modules


def shard_module(module, mesh: Mesh, build: Callable[[Any], Any], cfg_of: Callable[[Any], Any] = lambda m: m.cfg):
    """A copy of an unsharded NNX module (target or drafter) in the tp layout of `mesh`, its parameters
    placed with their NamedShardings. `build(cfg)` constructs the module for a config (abstractly). A module
    already in a tp layout is refused: its config no longer says how the unsharded one reads (kv heads repeated,
    vocabulary padded), so a second layout would disagree with it."""
    from flax import nnx

    held = model_tp_degree(module)
    if held > 1:
        raise ConfigError(f"the {type(module).__name__} is already in a {held}-way tensor-parallel layout; lay out "
                          "the unsharded one (loaded without mesh=)")
    cfg = cfg_of(module)
    tp = tp_degree(mesh)
    tcfg = tp_config(cfg, tp)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: build(tcfg)))
    flat = nnx.to_flat_state(abstract)
    src = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(module))}
    for path, var in flat:
        x = src[path]
        m = tp_index(path, cfg, tp)
        want = NamedSharding(mesh, param_spec(path, x.ndim))
        if m is not None:  # rearranged where the array is, then placed
            x = take_index(x, m[0], m[1])
        var.set_value(jax.device_put(x, want))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


@functools.lru_cache(maxsize=None)
def _take_cached(axis, idx_bytes, n, sharding):
    idx = np.frombuffer(idx_bytes, np.int64)[:n]
    return jax.jit(lambda x: take_index(x, axis, idx), out_shardings=sharding)


def _take_to(axis: int, idx: np.ndarray, sharding):
    idx = np.asarray(idx, np.int64)
    return _take_cached(axis, idx.tobytes(), len(idx), sharding)


def shard_target(model, mesh: Mesh):
    """The target (jaxspec.model.Qwen35) in the tp layout of `mesh`; checks the degrees first."""
    from flax import nnx

    from jaxspec.model import Qwen35

    check_target(model.cfg, tp_degree(mesh))
    return shard_module(model, mesh, lambda c: Qwen35(c, rngs=nnx.Rngs(0)))


def shard_drafter(drafter, mesh: Mesh):
    """The DFlash drafter (jaxspec.drafter.Drafter) in the tp layout of `mesh`."""
    from flax import nnx

    from jaxspec.drafter import Drafter

    check_drafter(drafter.cfg, tp_degree(mesh))
    return shard_module(drafter, mesh, lambda c: Drafter(c, rngs=nnx.Rngs(0)))


def shard_mtp(head, mesh: Mesh):
    """The MTP head (jaxspec.mtp.MTPHead) in the tp layout of `mesh`: its decoder layer split like the
    target's (heads, kv heads repeated past their count, MLP), its fc and norms replicated."""
    from flax import nnx
    from jaxspec.mtp import MTPHead
    check_target(head.cfg, tp_degree(mesh))
    return shard_module(head, mesh, lambda c: MTPHead(c, rngs=nnx.Rngs(0)))


def model_tp_degree(model) -> int:
    """The tensor-parallel degree of the mesh that `model`'s params are placed on; 1 off a mesh."""
    from flax import nnx

    for _, v in nnx.to_flat_state(nnx.state(model)):
        s = getattr(v.get_value(), "sharding", None)
        if isinstance(s, NamedSharding) and MODEL in s.mesh.axis_names:
            return s.mesh.shape[MODEL]
    return 1


def _where(sharding) -> str:
    if isinstance(sharding, NamedSharding):
        return f"{sharding.spec} on a mesh of shape {dict(sharding.mesh.shape)}"
    devices = sharding.device_set
    if len(devices) == 1:
        return f"on device {next(iter(devices))}"
    return f"{type(sharding).__name__} on {len(devices)} devices"


def check_laid_out(module, mesh: Mesh, what: str = "model", fix: str = "shard_target", *, arg: str | None = None,
                   load: bool = True) -> None:
    """ConfigError unless every array of the NNX `module` (target, drafter or MTP head, or its nnx.State, as a
    speculator's `params`) is placed as `shard_module` on `mesh` places it (`param_spec` on this mesh's devices, or
    an equivalent sharding): an unsharded module, or one laid out for another mesh, would fail deep inside the
    compiled program. The error names `what` and the fix, jaxspec.sharding.`fix`(`arg` (default `what`), mesh),
    and with `load` loading with mesh=mesh (the target's loaders take a mesh; the drafter's and MTP head's do not)."""
    from flax import nnx

    check_mesh(mesh)
    call = f"jaxspec.sharding.{fix}({arg or what}, mesh)" + (", or load it with mesh=mesh" if load else "")
    for path, var in nnx.to_flat_state(nnx.state(module)):
        x = var.get_value()
        if not isinstance(x, jax.Array):
            continue
        want = NamedSharding(mesh, param_spec(path, x.ndim))
        if not x.sharding.is_equivalent_to(want, x.ndim):
            name = "/".join(map(str, path))
            raise ConfigError(f"the {what} is not laid out for this mesh (shape {dict(mesh.shape)}): {name} is "
                              f"{_where(x.sharding)}, not {want.spec} on the mesh; lay it out with {call}")


# ------------------------------------------------------------------------------------------------ state


def state_shardings(mesh: Mesh, state):
    """NamedShardings for a State, DrafterCache or any dataclass pytree of them (fields by STATE_AXES;
    other arrays: batch on the data axis when their first dim is the batch, else replicated)."""
    def one(path, leaf):
        field = next((str(getattr(k, "name", "")) for k in reversed(path) if hasattr(k, "name")), "")
        ndim = len(leaf.shape)
        if field in STATE_AXES and len(STATE_AXES[field]) == ndim:
            return NamedSharding(mesh, spec(STATE_AXES[field]))
        if ndim and leaf.shape[0] % dp_degree(mesh) == 0 and not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return NamedSharding(mesh, P(DATA))
        return NamedSharding(mesh, P())
    return jax.tree_util.tree_map_with_path(one, state)


def constrain_state(mesh: Mesh | None, state):
    """with_sharding_constraint of a state pytree to `state_shardings` (inside jit); no-op without a mesh."""
    if mesh is None:
        return state
    return jax.lax.with_sharding_constraint(state, state_shardings(mesh, state))


def state_maker(mesh: Mesh | None, make: Callable[[], Any]) -> Callable[[], Any]:
    """`make` (a state constructor) jitted, straight into its shardings under a mesh: one dispatch, not one per
    array (the 27B layout has ~130). Keep the result to make more states of that shape without compiling again."""
    if mesh is None:
        return jax.jit(make)
    abstract = jax.eval_shape(make)
    return jax.jit(make, out_shardings=state_shardings(mesh, abstract))


# ------------------------------------------------------------------------------------------------ memory

# The share of each GPU that JAX's allocator may take when the user sets none: JAX's own default is 0.75,
# which on an 80 GB card leaves the 27B target (53.8 GB with its embedding and lm_head) and its drafter less
# than one KV cache at 128K context (bench/results/2026-12-05-h100-s57/).
MEM_FRACTION = "0.90"
FRACTION_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def claim_device_memory() -> None:
    """Give JAX's GPU pool MEM_FRACTION of each device unless the environment sets a fraction; call it before
    the first use of a device (it only sets the environment variable the GPU client reads when it starts)."""
    if not any(os.environ.get(v) for v in FRACTION_VARS):
        os.environ[FRACTION_VARS[0]] = MEM_FRACTION


def device_room(devices) -> tuple[int, int] | None:
    """(the fewest bytes free in any device's pool, that device's pool size), or None where the devices report
    no memory statistics (CPU)."""
    rooms = []
    for d in devices:
        st = d.memory_stats() or {}
        if "bytes_limit" not in st:
            return None
        rooms.append((st["bytes_limit"] - st.get("bytes_in_use", 0), st["bytes_limit"]))
    return min(rooms) if rooms else None


def host_room(meminfo: str = "/proc/meminfo") -> tuple[int, int] | None:
    """(bytes of host memory available without swapping, the host's total), from Linux's `meminfo`; None
    elsewhere."""
    try:
        fields = dict(line.split(":", 1) for line in Path(meminfo).read_text().splitlines() if ":" in line)
        kib = lambda name: int(fields[name].split()[0]) * 1024
        return kib("MemAvailable"), kib("MemTotal")
    except (OSError, KeyError, ValueError, IndexError):
        return None


def room_problem(abstract, mesh: Mesh | None, what: str) -> str | None:
    """Why `abstract` (a pytree of ShapeDtypeStructs, e.g. jax.eval_shape of a state's constructor) cannot be
    allocated now: the largest per-device share of it, laid out by `state_shardings` under `mesh`, against the
    free bytes of the fullest device; on CPU devices (no pool statistics) all the shares against the host's
    available memory. None when it fits or nothing is known. It fails fast where the allocation would instead
    stall or fail deep inside a compiled call, or get the process killed by the kernel's out-of-memory killer."""
    devices = list(mesh.devices.flat) if mesh is not None else jax.devices()[:1]
    room = device_room(devices)
    on_host = room is None and all(d.platform == "cpu" for d in devices)
    if on_host:
        room = host_room()
    if room is None:
        return None
    shardings = state_shardings(mesh, abstract) if mesh is not None else None
    leaves = jax.tree_util.tree_leaves(abstract)
    shards = jax.tree_util.tree_leaves(shardings) if shardings is not None else [None] * len(leaves)
    need = sum(int(np.prod(s.shard_shape(x.shape) if s is not None else x.shape)) * x.dtype.itemsize
               for x, s in zip(leaves, shards))
    free, limit = room
    if on_host:
        need *= len(devices)             # CPU devices share the host's memory
        if need <= free:
            return None
        return (f"{what} needs {need / 2**30:.2f} GiB, but {free / 2**30:.2f} GiB of the host's "
                f"{limit / 2**30:.2f} GiB of memory are available")
    if need <= free:
        return None
    set_to = next((f"{v}={os.environ[v]}" for v in FRACTION_VARS if os.environ.get(v)), "JAX's default of 0.75")
    return (f"{what} needs {need / 2**30:.2f} GiB per device, but {free / 2**30:.2f} GiB of the device's "
            f"{limit / 2**30:.2f} GiB pool is free (the pool is {set_to} of its memory; raise "
            f"{FRACTION_VARS[0]} only if nothing else uses the device)")


# ------------------------------------------------------------------------------------------------ kernels


def _manual_mesh():
    """The mesh being traced under if it has the (data, model) axes and more than one device, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or DATA not in mesh.axis_names or MODEL not in mesh.axis_names or mesh.size == 1:
        return None
    return mesh


def _manual(fn, args, in_specs, out_specs):
    """fn(*args) per shard with shard_map over (data, model) when a mesh with those axes is set; else fn(*args)."""
    mesh = _manual_mesh()
    if mesh is None:
        return fn(*args)
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*args)


def per_shard(fn, q, k, v, g, beta, anc, s0):
    """The tree delta rule (q, k, v [B,N,H,D]; g, beta [B,N,H]; anc [B,N,N]; s0 [B,H,Dk,Dv]) run per shard
    over (data: batch, model: heads)."""
    heads4, heads3 = P(DATA, None, MODEL, None), P(DATA, None, MODEL)
    return _manual(fn, (q, k, v, g, beta, anc, s0),
                   (heads4, heads4, heads4, heads3, heads3, P(DATA), P(DATA, MODEL)), (heads4, heads4, heads3))


def per_shard_chain(fn, q, k, v, g, beta, s0):
    """The chain delta rule (q, k, v [B,T,H,D]; g, beta [B,T,H]; s0 [B,H,Dk,Dv]; returns o [B,T,H,Dv] and the last
    state) run per shard over (data: batch, model: heads)."""
    heads4, heads3 = P(DATA, None, MODEL, None), P(DATA, None, MODEL)
    return _manual(fn, (q, k, v, g, beta, s0), (heads4, heads4, heads4, heads3, heads3, P(DATA, MODEL)),
                   (heads4, P(DATA, MODEL)))


def per_shard_commit(fn, s0s, w, k, delta, eg, keep):
    """The commit's GDN state update (s0s: per layer [B,H,Dk,Dv]; w [L,B,P,H]; k [L,B,P,Hk,Dk]; delta
    [L,B,P,H,Dv]; eg [L,B,H]; keep [B]) run per shard over (data: batch, model: heads)."""
    state, heads4, heads5 = P(DATA, MODEL), P(None, DATA, None, MODEL), P(None, DATA, None, MODEL, None)
    states = tuple(state for _ in s0s)
    return _manual(fn, (tuple(s0s), w, k, delta, eg, keep),
                   (states, heads4, heads5, heads5, P(None, DATA, MODEL), P(DATA)), states)


def per_shard_conv_commit(fn, hists, conv_ins, win, keep):
    """The commit's conv-history update (hists: per layer [B,K-1,C]; conv_ins: per layer [B,N,C]; win [B,K-1];
    keep [B]) run per shard over (data: batch, model: GDN channels, stored per key-head group)."""
    chans = P(DATA, None, MODEL)
    hs = tuple(chans for _ in hists)
    return _manual(fn, (tuple(hists), tuple(conv_ins), win, keep), (hs, hs, P(DATA), P(DATA)), hs)


def vocab_choice(partial, combine, x):
    """The verify op's choice per row of logits x [B, ..., V] sharded as (data, ..., model) on the mesh
    being traced under, run per shard: `partial(rows [R, V / tp], row0, col0)` gives each row's best
    (value, global column) in that shard (pallas_kernels/verify/api.choice_partial); the tp bests are
    gathered in column order and `combine` ([R, tp] values and columns -> [R] choices) keeps the first
    best, as argmax over the whole row does. None without such a mesh or when the vocabulary does not
    split evenly."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or MODEL not in mesh.axis_names or MODEL in mesh.manual_axes:
        return None
    tp, v = mesh.shape[MODEL], x.shape[-1]
    if v % tp:
        return None
    batch = DATA if DATA in mesh.axis_names and x.shape[0] % mesh.shape[DATA] == 0 else None
    lead = (batch,) + (None,) * (x.ndim - 2)

    def local(xs):
        rows = xs.reshape(-1, xs.shape[-1])
        row0 = jax.lax.axis_index(batch) * rows.shape[0] if batch else 0
        val, idx = partial(rows, row0, jax.lax.axis_index(MODEL) * xs.shape[-1])
        # one collective for both: [R, tp] each, shards in column order
        val, idx = jax.lax.all_gather((val, idx), MODEL, axis=1)
        return combine(val, idx).reshape(xs.shape[:-1])

    return jax.shard_map(local, mesh=mesh, in_specs=P(*lead, MODEL), out_specs=P(*lead), check_vma=False)(x)


def per_shard_rows(fn, x, u, w):
    """A row-wise op on the residual stream (x, u [B, N, D], batch on the data axis, replicated over the
    model axis; w [D] replicated), e.g. pallas_kernels/add_rms_norm, run per shard; fn returns three arrays
    [B, N, ...] of whole rows (add_rms_norm: x + u, h and the row scale [B, N, 1]). Under a mesh u must be whole:
    K slices [S, B, N, D] would be split along S (model.out_slices hands none over there)."""
    if u.ndim != x.ndim and _manual_mesh() is not None:
        raise ValueError(f"per_shard_rows: u {u.shape} must be a whole update of x's shape {x.shape}, not slices")
    rows = P(DATA, None, None)
    return _manual(fn, (x, u, w), (rows, rows, P()), (rows, rows, rows))


def per_shard_gdn_decode(fn, conv_in, history, conv_w, z, a, b, A_log, dt_bias, norm_w, s0):
    """The fused GDN decode step (pallas_kernels/gdn_decode: conv_in [B,C]; history [B,K-1,C]; conv_w [K,C];
    z [B,Hv,Dv]; a, b [B,Hv]; A_log, dt_bias [Hv]; norm_w [Dv]; s0 [B,Hv,Dk,Dv]) run per shard over (data:
    batch, model: GDN groups). The conv channels are stored per key-head group (convert/keys.py), so a
    shard's contiguous slice of them holds whole groups: its key heads with their value heads."""
    split, split_rows = P(DATA, MODEL), P(DATA, MODEL, None)      # [B, channels or heads], [B, heads, D]
    return _manual(fn, (conv_in, history, conv_w, z, a, b, A_log, dt_bias, norm_w, s0),
                   (split, P(DATA, None, MODEL), P(None, MODEL), split_rows, split, split, P(MODEL), P(MODEL), P(),
                    P(DATA, MODEL, None, None)),
                   (split_rows, split_rows, split_rows, split))


def per_shard_gdn_tree_inputs(fn, y, history, conv_w, A_log, dt_bias, rows):
    """The GDN tree inputs (pallas_kernels/gdn_tree_inputs: y [B,N,W] the in_proj product; history [B,K-1,C];
    conv_w [K,C]; A_log, dt_bias [Hv]; rows [B,K,N]) run per shard over (data: batch, model: GDN groups): y's
    columns, like the conv channels, are stored per key-head group, so a shard's contiguous slice holds whole
    groups. Returns q, k [B,N,Hk,Dk], v [B,N,Hv,Dv], g, beta [B,N,Hv], split by heads."""
    heads4, heads3 = P(DATA, None, MODEL, None), P(DATA, None, MODEL)
    return _manual(fn, (y, history, conv_w, A_log, dt_bias, rows),
                   (P(DATA, None, MODEL), P(DATA, None, MODEL), P(None, MODEL), P(MODEL), P(MODEL), P(DATA)),
                   (heads4, heads4, heads4, heads3, heads3))


def per_shard_attention(fn, q, keys, values, start, anc):
    """Tree attention (q [B,N,H,hd]; keys, values [B,L,KV,hd]; start [B]; anc [B,N,N]) run per shard over
    (data: batch, model: heads). A shard's query heads read exactly its own kv heads: both are split in
    contiguous blocks, and kv heads are repeated at load when the degree exceeds them (tp_config)."""
    heads = P(DATA, None, MODEL, None)
    return _manual(fn, (q, keys, values, start, anc), (heads, heads, heads, P(DATA), P(DATA)), heads)


def per_shard_chain_attention(fn, q, k, v, keys, values, start):
    """Chain attention (q [B,N,H,hd]; the chain's k, v [B,N,KV,hd]; keys, values [B,L,KV,hd]; start [B]) run per
    shard over (data: batch, model: heads), as `per_shard_attention`."""
    heads = P(DATA, None, MODEL, None)
    return _manual(fn, (q, k, v, keys, values, start), (heads,) * 5 + (P(DATA),), heads)


# ------------------------------------------------------------------------------------------------ loading


def base_sharding(mesh: Mesh, cfg) -> Callable[[tuple, tuple], NamedSharding]:
    """(param path, shape) -> the sharding to read the *unsharded* layout's param with: its tp sharding,
    except along an axis that `tp_index` rearranges (kv heads repeated, vocabulary padded), which stays
    whole until `to_tp_layout` rearranges it on the devices."""
    tp = tp_degree(mesh)

    def get(path, shape):
        s = list(param_spec(path, len(shape))) + [None] * len(shape)
        m = tp_index(path, cfg, tp)
        if m is not None:
            s[m[0]] = None
        return NamedSharding(mesh, P(*s[:len(shape)]))
    return get


def to_tp_layout(abstract_fn, cfg, mesh: Mesh, values: dict):
    """(graphdef, flat abstract state, values) of the tp layout, from `values` of the unsharded layout read
    with `base_sharding`. abstract_fn(config) -> (graphdef, flat state), as convert/hf.abstract_params."""
    tp = tp_degree(mesh)
    graphdef, flat = abstract_fn(tp_config(cfg, tp))
    out = dict(values)
    for path, x in values.items():
        m = tp_index(path, cfg, tp)
        if m is not None:
            out[path] = _take_to(m[0], m[1], NamedSharding(mesh, param_spec(path, x.ndim)))(x)
    return graphdef, flat, out


def vocab_rows(table, ids):
    """table[ids] for a table [V, D] whose rows (the vocabulary) are split on the model axis of the mesh
    being traced under: each shard reads the ids that fall in its rows (zeros elsewhere) and one
    all-reduce of [..., D] sums the shards. Without this, GSPMD gathers the whole table onto every GPU
    for each lookup (2.5 GB per decode step at the real shape: bench/results/2026-11-30-h200x2-tp-probe).
    ids must lie in [0, V). jnp.take where no such mesh is set or the rows do not split evenly."""
    mesh = jax.sharding.get_abstract_mesh()
    tp = 1 if mesh.empty or MODEL not in mesh.axis_names or MODEL in mesh.manual_axes else mesh.shape[MODEL]
    if tp == 1 or table.shape[0] % tp:
        return jnp.take(table, ids, axis=0)
    batch = DATA if DATA in mesh.axis_names and ids.ndim and ids.shape[0] % mesh.shape[DATA] == 0 else None
    lead = P(batch, *(None,) * (ids.ndim - 1))

    def local(rows, idx):
        idx = idx - jax.lax.axis_index(MODEL) * rows.shape[0]
        mine = (idx >= 0) & (idx < rows.shape[0])
        out = jnp.take(rows, jnp.where(mine, idx, 0), axis=0)
        return jax.lax.psum(jnp.where(mine[..., None], out, jnp.zeros((), out.dtype)), MODEL)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(MODEL, None), lead), out_specs=P(*lead, None),
                         check_vma=False)(table, ids)


def vocab_top_k(x, k: int, local_top_k=jax.lax.top_k):
    """`lax.top_k` over a vocabulary (last axis) split on the model axis of the mesh being traced under:
    each shard ranks its own slice, then the tp * k winners (gathered in vocabulary order) are ranked
    again, so ties keep the lower token id as a stable top_k does. None without such a mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or MODEL not in mesh.axis_names or mesh.shape[MODEL] == 1 or MODEL in mesh.manual_axes:
        return None
    tp = mesh.shape[MODEL]
    v = x.shape[-1]
    if v % tp or k > v // tp:
        return None
    batch = DATA if DATA in mesh.axis_names and x.shape[0] % mesh.shape[DATA] == 0 else None
    lead = (batch,) + (None,) * (x.ndim - 2)

    def local(xs):
        val, idx = local_top_k(xs, k)
        idx = idx + jax.lax.axis_index(MODEL) * (v // tp)
        val = jax.lax.all_gather(val, MODEL, axis=xs.ndim - 1, tiled=True)
        idx = jax.lax.all_gather(idx, MODEL, axis=xs.ndim - 1, tiled=True)
        top, pos = jax.lax.top_k(val, k)
        return top, jnp.take_along_axis(idx, pos, -1)

    return jax.shard_map(local, mesh=mesh, in_specs=P(*lead, MODEL), out_specs=(P(*lead, None), P(*lead, None)),
                         check_vma=False)(x)
