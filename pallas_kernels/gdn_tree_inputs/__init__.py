"""The GDN layer's inputs to the tree delta rule (conv along the tree, silu, l2 norms, gates) as one kernel;
reference.py is the spec."""

from pallas_kernels.gdn_tree_inputs.api import ENV_VAR, IMPLEMENTATIONS, gdn_tree_inputs, resolve

__all__ = ["gdn_tree_inputs", "resolve", "ENV_VAR", "IMPLEMENTATIONS"]
