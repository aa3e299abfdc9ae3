"""How every op in pallas_kernels picks its implementation: an explicit `implementation=` wins, else the
op's environment variable (read when the caller is traced, so it reaches callers that pass no
argument), else the op's default. Unknown names are refused, naming where they came from."""

from __future__ import annotations

import os

import jax


def resolve(env_var: str, implementations: tuple[str, ...], default: str, implementation: str | None = None) -> str:
    name = implementation or os.environ.get(env_var) or None
    if name is None:
        return default
    if name not in implementations:
        source = "implementation" if implementation else env_var
        raise ValueError(f"{source}={name!r}: expected one of {', '.join(implementations)}")
    return name


def on_gpu() -> bool:
    """Whether the default backend is a GPU (where the Triton-lowered kernels are the default)."""
    return jax.default_backend() == "gpu"

