"""The gated delta rule over a tree of tokens (DESIGN.md section 2).

A chain is the special case of a tree whose ancestor mask is lower-triangular, so the chunk of a
prefill and the block of a tree verify are the same op. `tree_delta_rule` dispatches between the
Pallas GPU kernels and the jnp implementations (api.py); reference.py is the spec. A long chain (a prefill) runs
through `chain_delta_rule` (chain.py): every block's factors at once, then one pass of the state over the blocks.
"""

from pallas_kernels.tree_delta_rule.api import ENV_VAR, IMPLEMENTATIONS, resolve, tree_delta_rule
from pallas_kernels.tree_delta_rule.chain import chain_delta_rule
from pallas_kernels.tree_delta_rule.reference import path_terms, state_at, states_at

__all__ = ["tree_delta_rule", "chain_delta_rule", "path_terms", "state_at", "states_at", "resolve", "ENV_VAR",
           "IMPLEMENTATIONS"]
