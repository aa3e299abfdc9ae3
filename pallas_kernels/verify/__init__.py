"""Verification: the target's own choice at every tree node from its logits (DESIGN.md section 3,
"Acceptance"), greedy or sampled at a temperature, in one pass over the logits. `target_choice`
dispatches between the Pallas GPU kernel and the jnp implementations (api.py)."""

from pallas_kernels.verify.api import ENV_VAR, IMPLEMENTATIONS, resolve, target_choice

__all__ = ["target_choice", "resolve", "ENV_VAR", "IMPLEMENTATIONS"]
