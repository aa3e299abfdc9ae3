"""The commit's GDN state update for every layer at once (reference.py: the contract; pallas_triton.py: one kernel
for all layers; api.py: dispatch through JAXSPEC_GDN_COMMIT)."""

from pallas_kernels.gdn_commit.api import ENV_VAR, IMPLEMENTATIONS, gdn_commit, resolve

__all__ = ["gdn_commit", "resolve", "ENV_VAR", "IMPLEMENTATIONS"]
