"""The GDN layer's output gate: the RMSNorm of the tree delta rule's output times silu(z), read from the in_proj
product, as one kernel; reference.py is the spec."""

from pallas_kernels.gdn_gated_norm.api import ENV_VAR, IMPLEMENTATIONS, gdn_gated_norm, resolve

__all__ = ["gdn_gated_norm", "resolve", "ENV_VAR", "IMPLEMENTATIONS"]
