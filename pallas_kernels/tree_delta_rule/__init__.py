"""The gated delta rule over a tree of tokens (DESIGN.md section 2).

A chain is the special case of a tree whose ancestor mask is lower-triangular, so the chunk of a
prefill and the block of a tree verify are the same op.
"""

from pallas_kernels.tree_delta_rule.reference import tree_delta_rule, state_at

__all__ = ["tree_delta_rule", "state_at"]
