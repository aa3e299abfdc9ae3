"""How every op in pallas_kernels picks its implementation: an explicit `implementation=` wins, else the
op's environment variable (read when the caller is traced, so it reaches callers that pass no
argument), else the op's default. Unknown names are refused, naming where they came from.

The Pallas kernels have no VJP: a loss traced inside `differentiable()` (the trainer's step) gets each
op's jnp implementation wherever the environment or the GPU default would pick a kernel; only an
explicit `implementation=` still picks a kernel there."""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import importlib
import os

import jax
import jax.numpy as jnp


# Every JAXSPEC_* environment variable jaxspec reads. One set but not listed here (a misspelling, or a flag since
# removed) is refused by `check_flags`: it would choose nothing, yet a result's `flags()` would record it.
OP_FLAGS = ("JAXSPEC_ADD_RMS_NORM", "JAXSPEC_CHAIN_ATTENTION", "JAXSPEC_CONV_COMMIT", "JAXSPEC_GDN_COMMIT",
            "JAXSPEC_GDN_DECODE", "JAXSPEC_GDN_TREE_INPUTS", "JAXSPEC_NUCLEUS_MASS", "JAXSPEC_SKINNY_MATMUL",
            "JAXSPEC_TREE_ATTENTION", "JAXSPEC_TREE_DELTA_RULE", "JAXSPEC_VERIFY")
CHOICE_FLAGS = OP_FLAGS + ("JAXSPEC_DDTREE_TOP_K",      # jaxspec/ddtree.py: the tree build's top-k
                           "JAXSPEC_LOOP_GRAPHS")       # jaxspec/engine.py: the round loops as CUDA graphs
OTHER_FLAGS = ("JAXSPEC_COMMIT", "JAXSPEC_DIRTY",       # jaxspec/provenance.py: a run's commit, from a snapshot
               "JAXSPEC_DEMO_DIR")                      # jaxspec/generate.py: where the demo pair lives
FLAGS = CHOICE_FLAGS + OTHER_FLAGS
LOOP_GRAPHS_MODES = ("none", "ar", "all")          # which round loops compile as CUDA graphs (jaxspec/engine.py)
DDTREE_TOP_K_METHODS = ("sort", "count")           # how the tree build takes its top-k (jaxspec/ddtree.py)
GPU_ONLY = ("pallas_triton", "pallas_mosaic", "pallas_cudnn")   # compiled kernels: they run on a GPU backend only


def flag_values(flag: str) -> tuple[str, ...]:
    """The values a choice flag takes: an op's, the implementations its package (named after the flag) offers."""
    if flag in OP_FLAGS:
        return importlib.import_module(f"pallas_kernels.{flag.removeprefix('JAXSPEC_').lower()}.api").IMPLEMENTATIONS
    return {"JAXSPEC_LOOP_GRAPHS": LOOP_GRAPHS_MODES, "JAXSPEC_DDTREE_TOP_K": DDTREE_TOP_K_METHODS}[flag]


def check_flags(environ=None) -> None:
    """Refuse a JAXSPEC_* variable in the environment that jaxspec does not read, naming the nearest flag, and a
    choice flag set to a value it does not take: before any work, not where the flag is first read (an op's when
    the model is first traced, after a 27B's load)."""
    environ = os.environ if environ is None else environ
    for name in sorted(k for k in environ if k.startswith("JAXSPEC_") and k not in FLAGS):
        near = difflib.get_close_matches(name, FLAGS, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ValueError(f"environment variable {name} is set, but jaxspec reads no such variable{hint}; its "
                         f"flags are {', '.join(FLAGS)}")
    for name in CHOICE_FLAGS:
        if environ.get(name) and environ[name] not in flag_values(name):
            raise ValueError(f"{name}={environ[name]!r}: expected one of {', '.join(flag_values(name))}")


def check_gpu_flags(environ=None, backend=None) -> None:
    """Refuse an op's flag that forces a compiled GPU kernel where jax's default backend (`backend`, looked up only
    when such a flag is set) is not a GPU: the kernel would fail when the model is first traced, in Pallas' words,
    which do not name the flag."""
    environ = os.environ if environ is None else environ
    forced = [(k, environ[k]) for k in OP_FLAGS if environ.get(k) in GPU_ONLY]
    if forced:
        backend = backend or jax.default_backend()
        if backend != "gpu":
            name, value = forced[0]
            here = [v for v in flag_values(name) if v not in GPU_ONLY]
            raise ValueError(f"{name}={value!r} forces a GPU kernel, but jax's default backend here is {backend!r}; "
                             f"unset it or use one of {', '.join(here)}")


def chosen_by(env_var: str, implementation: str | None) -> str:
    """Where a forced implementation came from, for an error: the argument or the environment variable."""
    return f"implementation={implementation!r}" if implementation else f"{env_var}={os.environ.get(env_var)!r}"


def parse_args(ap, argv=None):
    """`ap.parse_args(argv)`, then the environment's flags checked (`check_flags`, `check_gpu_flags`): a bad one is
    the parser's error, one line and status 2, before the command does any work. `check_gpu_flags` may start the
    GPU client, so the CLI's claim on device memory (`jaxspec.sharding.claim_device_memory`) is made first."""
    from jaxspec.sharding import claim_device_memory
    args = ap.parse_args(argv)
    try:
        check_flags()
        claim_device_memory()
        check_gpu_flags()
    except ValueError as e:
        ap.error(str(e))
    return args


_DIFFERENTIABLE = contextvars.ContextVar("jaxspec_differentiable", default=False)


@contextlib.contextmanager
def differentiable():
    """Ops traced inside pick an implementation that jax.grad can go through (see the module's doc)."""
    token = _DIFFERENTIABLE.set(True)
    try:
        yield
    finally:
        _DIFFERENTIABLE.reset(token)


def resolve(env_var: str, implementations: tuple[str, ...], default: str, implementation: str | None = None,
            jnp_default: str = "reference") -> str:
    """The implementation to run; `jnp_default` is the op's differentiable one, for `differentiable()`."""
    check_flags()
    name = implementation or os.environ.get(env_var) or None
    if name is not None and name not in implementations:
        source = "implementation" if implementation else env_var
        raise ValueError(f"{source}={name!r}: expected one of {', '.join(implementations)}")
    if implementation:
        return implementation
    name = name or default
    if _DIFFERENTIABLE.get() and name.startswith("pallas"):
        return jnp_default
    return name


def on_gpu() -> bool:
    """Whether the default backend is a GPU (where the Triton-lowered kernels are the default)."""
    return jax.default_backend() == "gpu"


def flags() -> dict:
    """The JAXSPEC_* variables set in this process that choose an implementation (the kernels', the loop graphs',
    the tree build's), so that a result can say which ran; unknown names are refused (`check_flags`). An empty one
    chooses nothing (it reads as unset) and is left out."""
    check_flags()
    return {k: v for k, v in sorted(os.environ.items()) if k in CHOICE_FLAGS and v}


def check_per_layer(op: str, name: str, arrays, layout: str, dtype=None, item: tuple[str, str] = ("array", "arrays")):
    """ValueError naming `op` and `name` unless `arrays` is a non-empty sequence (one a layer) of arrays of one shape
    and one dtype (`dtype` where given), of layout's rank (e.g. "[B, K-1, C]"); item: what one is called, singular
    and plural. The commit ops' per-layer inputs; returns the first."""
    if not len(arrays):
        raise ValueError(f"{op}: {name} is empty: expected one {layout} {item[0]} a GDN layer")
    a = arrays[0]
    ndim = layout.count(",") + 1
    if a.ndim != ndim or any(x.shape != a.shape or x.dtype != (dtype or a.dtype) for x in arrays):
        kind = f"{jnp.dtype(dtype).name.replace('float', 'fp')} " if dtype else ""
        same = "of one shape" if dtype else "of one shape and dtype"
        raise ValueError(f"{op}: {name} must be {kind}{layout} {item[1]} {same}, got "
                         f"{sorted({(tuple(x.shape), str(x.dtype)) for x in arrays})}")
    return a

