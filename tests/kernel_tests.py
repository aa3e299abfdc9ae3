"""What the kernel test files share (the `seed` fixture is in conftest.py)."""

from __future__ import annotations

import jax
import pytest


def on_gpu(test):
    """`gpu`-marked (CI deselects it) and skipped, visibly, where there is no GPU."""
    skip = pytest.mark.skipif(jax.default_backend() != "gpu",
                              reason="needs a GPU: JAX_PLATFORMS=cuda python -m pytest tests/<file> -m gpu")
    return pytest.mark.gpu(skip(test))


def check_dispatch(api, monkeypatch, gpu_default="reference"):
    """An op's dispatch: "reference" by default on a CPU, `gpu_default` on a GPU ("reference" for an opt-in
    kernel); its flag forces an implementation, an explicit implementation= wins over the flag, and an unknown
    name is refused naming the flag."""
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    assert api.resolve() == "reference"                        # this test runs on the CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert api.resolve() == gpu_default
    other = "reference" if gpu_default == "pallas_triton" else "pallas_triton"
    monkeypatch.setenv(api.ENV_VAR, other)
    assert api.resolve() == other and api.resolve(gpu_default) == gpu_default
    monkeypatch.setenv(api.ENV_VAR, "triton")
    with pytest.raises(ValueError, match=api.ENV_VAR):
        api.resolve()
