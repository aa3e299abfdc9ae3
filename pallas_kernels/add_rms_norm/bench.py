"""Time the residual add + RMSNorm at the real width, the kernel against the jnp reference (what XLA makes of the
same math), over the 127 norms of one step.

    JAX_PLATFORMS=cuda python -m pallas_kernels.add_rms_norm.bench [--sizes 1,16,64] [--json out.json]

One jit applies the op to --layers distinct (x, u, w) in sequence, each call's x the previous call's x + u (the
residual stream, so nothing is hoisted), and returns every call's outputs (so nothing is dropped). Per row count
(an AR step, a DFlash block of 16, a tree of 64): time per call, synchronised and on the device
(bench.profile.device_time, the kernels' summed durations), the bytes a call reads and writes over that time, and
the largest relative error against the reference (last call's outputs, bf16). In the model XLA runs the
reference as two kernels a norm (the add, then the sum of squares with h); alone here it may fuse them into one.
On a CPU (a check of the harness) the kernel runs in interpret mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bench.harness import layer_bench
from pallas_kernels.add_rms_norm import arg_specs, pallas_triton, reference


def main(argv=None):
    interpret = jax.default_backend() != "gpu"
    impls = {"reference": lambda *a: reference.add_rms_norm(*a, eps=1e-6, offset=1.0),
             "pallas_triton": lambda *a: pallas_triton.add_rms_norm(*a, eps=1e-6, offset=1.0, interpret=interpret),
             "pallas_triton/w8": lambda *a: pallas_triton.add_rms_norm(*a, eps=1e-6, offset=1.0, num_warps=8,
                                                                         interpret=interpret)}

    def stack_for(n, layers):
        return [arg_specs.make_inputs(i, (1, n, arg_specs.REAL_WIDTH), jnp.bfloat16) for i in range(layers)]

    link = lambda args, out: (out[0],) + args[1:]
    return layer_bench(argv, __doc__, impls, stack_for, link, arg_specs.REAL_NORMS, sizes="1,16,64")


if __name__ == "__main__":
    main()
