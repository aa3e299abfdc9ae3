"""How every op in pallas_kernels picks its implementation: an explicit `implementation=` wins, else the
op's environment variable (read when the caller is traced, so it reaches callers that pass no
argument), else the op's default. Unknown names are refused, naming where they came from.

The Pallas kernels have no VJP: a loss traced inside `differentiable()` (the trainer's step) gets each
op's jnp implementation wherever the environment or the GPU default would pick a kernel; only an
explicit `implementation=` still picks a kernel there."""

from __future__ import annotations

import contextlib
import contextvars
import os

import jax


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
    """The JAXSPEC_* variables set in this process (the kernels', the loop graphs', the tree build's), so that a
    result can say which implementations ran; JAXSPEC_COMMIT and JAXSPEC_DEMO_DIR choose none."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith("JAXSPEC_") and k not in ("JAXSPEC_COMMIT", "JAXSPEC_DEMO_DIR")}
