"""Time the skinny matmul against XLA's dot at the real projection shapes of Qwen3.6-27B.

    JAX_PLATFORMS=cuda python -m pallas_kernels.skinny_matmul.bench [--rows 16,65] [--shapes a,b] [--sweep]
        [--json out.json]

Each timed call is one jit of `--layers` products with distinct weights (a layer's weights are streamed
from HBM as in the model, not re-read from L2; the next input depends on the previous output), bf16.
Reported per product: synchronised wall time and device time (bench.profile.device_time, the kernels'
summed durations, the split-K sum included), and the weight bytes over the device time in TB/s: the
rate that matters, since at 16 and 65 rows every projection is bound by its weight bytes; and the error
against XLA's dot (`rel_err_vs_xla`: max |out - xla| / max |xla|, XLA run untimed whatever `--impls` keeps).
`--sweep` adds tile variants of the kernels (Triton: block_n, block_k, split_k, warps, stages; Mosaic GPU:
block_n, split_k, pipeline steps, the product's form).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp

from bench.cli import writable_file
from bench.harness import time_kernel, write_results
from pallas_kernels.skinny_matmul import arg_specs, pallas_mosaic, pallas_triton, reference, tiling
from pallas_kernels import dispatch

SWEEP_TILES = ((64, 128), (128, 64), (128, 128), (256, 64), (128, 256))


def implementations(m: int, k: int, n: int, sweep: bool, on_gpu: bool, wave: bool = False):
    impls = {"xla": reference.matmul}
    if not on_gpu:
        return impls
    impls["pallas_triton"] = pallas_triton.matmul
    impls["pallas_mosaic"] = pallas_mosaic.matmul
    impls["pallas_mosaic/t"] = functools.partial(pallas_mosaic.matmul, transposed=True)
    if wave:
        # Mosaic GPU tiles whose blocks all fit on the GPU at once (tiling.resident_blocks): per column block width
        # and pipeline depth, the most K slices that keep one wave. The default tiles aim at two blocks per SM and
        # overshoot it (272 / 320 / 448 blocks where 264 fit at 16 rows): a second, nearly empty wave.
        # The transposed form only: it moves the fewest x bytes (rows padded to 16).
        for bn in (64, 128, 256):
            for steps in (2, 3, 4, 6, 8):
                smem = pallas_mosaic.smem_bytes(m, bn, 64, steps)
                if n % bn or smem > pallas_mosaic.SMEM_BYTES:
                    continue
                fit = [s for s in (1, 2, 4, 8, 16, 32)
                       if k % (64 * s) == 0 and n // bn * s <= tiling.resident_blocks(smem)]
                if fit:
                    impls[f"pallas_mosaic/n{bn}/s{fit[-1]}/st{steps}/t"] = functools.partial(
                        pallas_mosaic.matmul, block_n=bn, split_k=fit[-1], steps=steps, transposed=True)
    if sweep:
        # Mosaic GPU: each column block width at 4 steps; then, at 128 columns, 2 and 6 steps and half / twice
        # the K slices; each in both forms of the product.
        picks = [(bn, 4, 1) for bn in (64, 128, 256)] + [(128, 2, 1), (128, 6, 1), (128, 4, 0.5), (128, 4, 2)]
        for bn, steps, split_x in picks:
            if n % bn or pallas_mosaic.smem_bytes(m, bn, 64, steps, transposed=False) > pallas_mosaic.SMEM_BYTES:
                continue
            split = max(int(pallas_mosaic.tiles(m, k, n, bn, 64, None, steps, transposed=False)[2] * split_x), 1)
            if k % (64 * split):
                continue
            for tr in (False, True):
                impls[f"pallas_mosaic/n{bn}/s{split}/st{steps}{'/t' if tr else ''}"] = functools.partial(
                    pallas_mosaic.matmul, block_n=bn, split_k=split, steps=steps, transposed=tr)
        for bn, bk in SWEEP_TILES:
            if n % bn or k % bk or pallas_triton.smem_bytes(m, bn, bk, 2, 3) > pallas_triton.SMEM_BYTES:
                continue
            auto = pallas_triton.tiles(m, k, n, bn, bk)[2]
            for split in sorted({max(auto // 2, 1), auto, auto * 2}):
                if k % (bk * split):
                    continue
                for warps, stages in ((4, 3), (8, 3), (4, 4)):
                    if pallas_triton.smem_bytes(m, bn, bk, 2, stages) > pallas_triton.SMEM_BYTES:
                        continue
                    impls[f"pallas_triton/n{bn}/k{bk}/s{split}/w{warps}/st{stages}"] = functools.partial(
                        pallas_triton.matmul, block_n=bn, block_k=bk, split_k=split, num_warps=warps,
                        num_stages=stages)
    return impls


def stacked(fn, layers):
    def run(x, ws):
        y = None
        for i in range(layers):
            y = fn(x, ws[i])
            x = x + (1e-6 * jnp.mean(y.astype(jnp.float32))).astype(x.dtype)   # the next depends on this one
        return y
    return jax.jit(run)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(map(str, arg_specs.ROWS)))
    p.add_argument("--shapes", default=",".join(arg_specs.REAL),
                   help="names from arg_specs.REAL and arg_specs.FUSED (the model's fused products)")
    p.add_argument("--layers", type=int, default=8, help="distinct weights per timed call")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--wave", action="store_true", help="add the Mosaic GPU tiles whose blocks fit in one wave")
    p.add_argument("--impls", default="", help="keep only implementations whose name starts with one of these "
                   "comma-separated prefixes (e.g. xla,pallas_mosaic); default: all")
    p.add_argument("--json")
    a = dispatch.parse_args(p, argv)
    writable_file(p, "--json", a.json)         # before the timing, not after it
    names = a.shapes.split(",")
    shapes = {**arg_specs.REAL, **arg_specs.FUSED}
    unknown = [s for s in names if s not in shapes]
    if unknown:
        p.error(f"--shapes: unknown {', '.join(unknown)}; known: {', '.join(shapes)}")
    on_gpu = jax.default_backend() == "gpu"
    ms = [int(m) for m in a.rows.split(",")]
    keep = tuple(x for x in a.impls.split(",") if x)
    known = {impl: None for name in names for m in ms
             for impl in implementations(m, *shapes[name][:2], a.sweep, on_gpu, a.wave)}
    unknown = [x for x in keep if not any(impl.startswith(x) for impl in known)]
    if unknown:
        bases = ", ".join(dict.fromkeys(impl.split("/")[0] for impl in known))
        p.error(f"--impls: {unknown} not available here; choose prefixes of {bases} (or of their variants)")
    rows = []
    print(f"{jax.devices()[0].device_kind}; bf16, per product, median of {a.iters} calls of {a.layers} products")
    for name in names:
        k, n, _ = shapes[name]
        ws = jnp.stack([arg_specs.make_inputs(i + 1, 1, k, n, jnp.bfloat16)[1] for i in range(a.layers)])
        gb = k * n * 2 / 1e9
        for m in ms:
            x = arg_specs.make_inputs(0, m, k, n, jnp.bfloat16)[0]
            # the error column's baseline: XLA's dot (untimed), whichever implementations run
            ref = stacked(reference.matmul, a.layers)(x, ws).astype(jnp.float32)
            for impl, fn in implementations(m, k, n, a.sweep, on_gpu, a.wave).items():
                if keep and not impl.startswith(keep):
                    continue
                run = stacked(fn, a.layers)
                try:
                    t = time_kernel(lambda: run(x, ws), a.iters)
                except Exception as e:  # a variant that does not compile is a result, not a crash
                    print(f"{name:16s} M={m:3d} {impl:40s} failed: {type(e).__name__}: {str(e).splitlines()[0][:90]}",
                          flush=True)
                    rows.append(dict(shape=name, m=m, k=k, n=n, impl=impl, error=str(e)[:500]))
                    continue
                out, compile_s = t["out"], t["compile_s"]
                us, dev_us = t["wall_s"] / a.layers * 1e6, t["device_s"] / a.layers * 1e6
                err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref)))
                tb_s = gb / (dev_us * 1e-6) / 1e3
                rows.append(dict(shape=name, m=m, k=k, n=n, impl=impl, us=us, device_us=dev_us, tb_s=tb_s,
                                 rel_err_vs_xla=err, compile_s=compile_s))
                print(f"{name:16s} M={m:3d} {impl:40s} {us:8.1f} us (device {dev_us:7.1f}, {tb_s:5.2f} TB/s)  "
                      f"err {err:.1e}  compile {compile_s:.1f} s", flush=True)
    if a.json:
        write_results(a.json, rows, layers=a.layers, dtype="bfloat16")


if __name__ == "__main__":
    main()
