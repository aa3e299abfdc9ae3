"""y = x @ w for the few rows of a verify, streaming the weights once (opt-in); reference.py is the spec."""

from pallas_kernels.skinny_matmul.api import ENV_VAR, IMPLEMENTATIONS, applies, matmul, resolve

__all__ = ["matmul", "resolve", "applies", "ENV_VAR", "IMPLEMENTATIONS"]
