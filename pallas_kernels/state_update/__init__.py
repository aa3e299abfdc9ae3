"""The commit's GDN state update of one layer (S1 from S0 and the accepted path's k, Delta, G) as one kernel;
reference.py is the spec."""

from pallas_kernels.state_update.api import ENV_VAR, IMPLEMENTATIONS, resolve, state_update

__all__ = ["state_update", "resolve", "ENV_VAR", "IMPLEMENTATIONS"]
