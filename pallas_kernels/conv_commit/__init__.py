"""The commit's conv-history update for every GDN layer at once (reference.py: the contract; pallas_triton.py: one
kernel for all layers, in place; api.py: dispatch through JAXSPEC_CONV_COMMIT)."""

from pallas_kernels.conv_commit.api import ENV_VAR, IMPLEMENTATIONS, conv_commit, resolve

__all__ = ["conv_commit", "resolve", "ENV_VAR", "IMPLEMENTATIONS"]
