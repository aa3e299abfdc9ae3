"""Time the commit's GDN state update at the real shape, the kernel against the jnp reference (what XLA makes of
the same math one layer at a time), over the 48 GDN layers of one commit.

    JAX_PLATFORMS=cuda python -m pallas_kernels.state_update.bench [--sizes 16,64,65] [--json out.json]

One jit applies the op to --layers distinct inputs in sequence (each layer's k depends on the previous layer's
S1, so nothing is hoisted). Per block size (a DFlash chain of 16, random trees of 64 and 65): time per layer,
synchronised and on the device, the bytes a layer reads and writes over that time, and the largest relative
error against the reference. The model's commit forms every layer's update in one product instead (the
reference's batched form, `states_at`): `python -m bench.verify_profile --commit` with JAXSPEC_STATE_UPDATE at
each value compares the two inside the model.
"""

from __future__ import annotations

import functools

import jax

from bench.harness import layer_bench
from pallas_kernels.state_update import arg_specs, pallas_triton, reference


def main(argv=None):
    impls = {"reference": reference.state_update}
    if jax.default_backend() == "gpu":
        impls["pallas_triton"] = pallas_triton.state_update
        # session 45's sweep: the path form's tile and warps, and the dot form (session 44's first kernel)
        for form, block_dv, num_warps in (("path", 32, 4), ("path", 128, 4), ("path", 64, 8), ("path", 128, 8),
                                          ("dot", 64, 4), ("dot", 32, 8)):
            impls[f"{form}/v{block_dv}/w{num_warps}"] = functools.partial(
                pallas_triton.state_update, form=form, block_dv=block_dv, num_warps=num_warps)

    def stack_for(n, layers):
        return [arg_specs.make_inputs(i, 1, n, **arg_specs.REAL, chain=n == 16) for i in range(layers)]

    link = lambda args, out: (args[0], args[1] + 1e-6 * out[:, :1, :1, :1]) + args[2:]
    layer_bench(argv, __doc__, impls, stack_for, link, arg_specs.REAL_GDN_LAYERS)


if __name__ == "__main__":
    main()
