"""Tree attention for the full-attention layers (DESIGN.md section 2): the N nodes of a tree attend
to the committed prefix and to their ancestors-or-self. `tree_attention` dispatches between the
Pallas GPU kernel and the jnp reference (api.py); reference.py is the spec.
"""

from pallas_kernels.tree_attention.api import ENV_VAR, IMPLEMENTATIONS, resolve, tree_attention

__all__ = ["tree_attention", "resolve", "ENV_VAR", "IMPLEMENTATIONS"]
