"""What the kernel test files share (the `seed` fixture is in conftest.py)."""

from __future__ import annotations

import jax
import pytest


def on_gpu(test):
    """`gpu`-marked (CI deselects it) and skipped, visibly, where there is no GPU."""
    skip = pytest.mark.skipif(jax.default_backend() != "gpu",
                              reason="needs a GPU: JAX_PLATFORMS=cuda python -m pytest tests/<file> -m gpu")
    return pytest.mark.gpu(skip(test))


def check_opt_in_dispatch(api, monkeypatch):
    """An opt-in op's dispatch: "reference" by default, on a GPU too; its flag picks the kernel, an explicit
    implementation= wins over the flag, and an unknown name is refused naming the flag."""
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    assert api.resolve() == "reference"
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert api.resolve() == "reference"
    monkeypatch.setenv(api.ENV_VAR, "pallas_triton")
    assert api.resolve() == "pallas_triton" and api.resolve("reference") == "reference"
    monkeypatch.setenv(api.ENV_VAR, "triton")
    with pytest.raises(ValueError, match=api.ENV_VAR):
        api.resolve()
