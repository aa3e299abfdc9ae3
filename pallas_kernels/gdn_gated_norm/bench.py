"""Time the GDN output gate at the real shape, the kernel against the jnp reference, over the 48 GDN layers of one
verify.

    JAX_PLATFORMS=cuda python -m pallas_kernels.gdn_gated_norm.bench [--sizes 16,64,65] [--json out.json]

One jit applies the op to --layers distinct inputs in sequence (each layer's o depends on the previous layer's
output, so nothing is hoisted). XLA may fuse the reference across the stacked layers, so its time here is a lower
bound of what it costs inside the model; bench.verify_profile is the comparison that counts. Per block size: time
per layer, synchronised and on the device (bench.profile.device_time), the bytes a layer reads and writes over
that time, and the largest relative error against the reference (bf16 y).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bench.harness import layer_bench
from pallas_kernels.gdn_gated_norm import arg_specs, pallas_triton, reference


def main(argv=None):
    dims = dict(dk=arg_specs.REAL["dk"], eps=arg_specs.EPS)
    impls = {"reference": lambda *x: reference.gdn_gated_norm(*x, **dims)}
    if jax.default_backend() == "gpu":
        impls["pallas_triton"] = lambda *x: pallas_triton.gdn_gated_norm(*x, **dims)
    stack_for = lambda n, layers: [arg_specs.make_inputs(i, 1, n, **arg_specs.REAL, dtype=jnp.bfloat16)
                                   for i in range(layers)]
    link = lambda args, out: (args[0] + 1e-3 * out[:, :, :1, None].astype(args[0].dtype),) + args[1:]
    layer_bench(argv, __doc__, impls, stack_for, link, arg_specs.REAL_GDN_LAYERS)


if __name__ == "__main__":
    main()
