"""Attention of a chain block (a prefill piece): the committed prefix by the tree attention kernel's prefix programs,
the block itself by a causal flash-attention kernel, the two merged by their softmax statistics."""

from pallas_kernels.chain_attention.api import chain_attention

__all__ = ["chain_attention"]
