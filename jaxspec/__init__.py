"""jaxspec: exact speculative decoding for the hybrid Qwen3.6 models in JAX."""

__version__ = "0.1.0"
