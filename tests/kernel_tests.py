"""What the kernel test files share (the `seed` fixture is in conftest.py)."""

from __future__ import annotations

import jax
import pytest


def on_gpu(test):
    """`gpu`-marked (CI deselects it) and skipped, visibly, where there is no GPU."""
    skip = pytest.mark.skipif(jax.default_backend() != "gpu",
                              reason="needs a GPU: JAX_PLATFORMS=cuda python -m pytest tests/<file> -m gpu")
    return pytest.mark.gpu(skip(test))
