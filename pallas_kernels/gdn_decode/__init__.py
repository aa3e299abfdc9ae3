"""One Gated DeltaNet decode step (a one-token chain) fused into one kernel; reference.py is the spec."""

from pallas_kernels.gdn_decode.api import ENV_VAR, IMPLEMENTATIONS, gdn_decode, resolve

__all__ = ["gdn_decode", "resolve", "ENV_VAR", "IMPLEMENTATIONS"]
