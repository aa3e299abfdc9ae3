"""Residual add + RMSNorm fused into one kernel; reference.py is the spec."""

from pallas_kernels.add_rms_norm.api import ENV_VAR, IMPLEMENTATIONS, add_rms_norm, resolve, slices_for
from pallas_kernels.add_rms_norm.reference import add

__all__ = ["add_rms_norm", "add", "resolve", "slices_for", "ENV_VAR", "IMPLEMENTATIONS"]
