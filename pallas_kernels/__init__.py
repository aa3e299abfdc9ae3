"""Kernels for the hot paths of jaxspec, one package per op, each beside its pure-jnp reference."""
