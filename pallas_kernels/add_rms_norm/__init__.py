"""Residual add + RMSNorm fused into one kernel; reference.py is the spec."""

from pallas_kernels.add_rms_norm.api import ENV_VAR, IMPLEMENTATIONS, add_rms_norm, resolve

__all__ = ["add_rms_norm", "resolve", "ENV_VAR", "IMPLEMENTATIONS"]
