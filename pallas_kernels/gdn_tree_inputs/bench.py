"""Time the GDN tree inputs at the real shape, the kernel against the jnp reference (what XLA makes of the same
math), over the 48 GDN layers of one verify.

    JAX_PLATFORMS=cuda python -m pallas_kernels.gdn_tree_inputs.bench [--sizes 16,64,65] [--json out.json]

One jit applies the op to --layers distinct inputs in sequence (each layer's in_proj product depends on the
previous layer's output, so nothing is hoisted). Per block size (a DFlash chain of 16, random trees of 64 and
65): time per layer, synchronised and on the device (bench.profile.device_time, the kernels' summed
durations), the bytes a layer reads and writes over that time, and the largest relative error against the
reference (last layer's outputs, bf16 inputs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bench.harness import layer_bench
from pallas_kernels.gdn_tree_inputs import arg_specs, pallas_triton, reference


def main(argv=None):
    dims = dict(dk=arg_specs.REAL["dk"], dv=arg_specs.REAL["dv"])
    impls = {"reference": lambda *x: reference.gdn_tree_inputs(*x, **dims)}
    if jax.default_backend() == "gpu":
        impls["pallas_triton"] = lambda *x: pallas_triton.gdn_tree_inputs(*x, **dims)

    def stack_for(n, layers):
        parent = arg_specs.random_parents(n, 1, n, chain=n == 16)
        return [arg_specs.make_inputs(i, parent, **arg_specs.REAL, dtype=jnp.bfloat16) for i in range(layers)]

    link = lambda args, out: (args[0] + (1e-3 * out[2][:, :, 0, :1]).astype(args[0].dtype),) + args[1:]
    layer_bench(argv, __doc__, impls, stack_for, link, arg_specs.REAL_GDN_LAYERS)


if __name__ == "__main__":
    main()
