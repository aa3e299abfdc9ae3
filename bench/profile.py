"""Charge the kernels of a profiled jitted step to the model's parts (attention, GDN, MLP, ...).

    python -m bench.profile trace.xplane.pb hlo.txt.gz [--steps N | --first-step] [--device N]

The harness names the parts with jax.named_scope while tracing, so every HLO instruction carries its
part in its op_name metadata. A kernel is tied to its HLO instruction by the trace's `hlo_op` stat, or,
inside a CUDA graph (XLA command buffers: hlo_op is then `command_buffer_N`), by the kernel's own name,
which is the fusion's name with '.' and '-' made '_'. Bytes per kernel are those of the fused
computation's parameters and result: exact for weight-streaming gemms and elementwise fusions, an upper
bound for gathers and slices (the embedding lookup counts the whole table). A trace of several devices is read
one device at a time (--device): their kernels run at once, so summed they would be no step's time.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import gzip
import json
import os
import re
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench.cli import at_least, exit_with, writable_file, write_json
from pallas_kernels import dispatch

PARTS = ("embed", "attn", "gdn", "mlp", "norm", "head", "commit")
_WEIGHT_PARTS = (("self_attn", "attn"), ("linear_attn", "gdn"), ("lm_head", "head"), ("embed_tokens", "embed"),
                 ("mlp", "mlp"), ("norm", "norm"))
_DEF = re.compile(r'^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$')
_HEADER = re.compile(r'^(?:ENTRY\s+)?%([\w.\-]+)\s*\((.*)\)\s*->\s*(.*)\{\s*$')
_SHAPE = re.compile(r'\b(bf16|f16|f32|f64|s8|u8|s16|s32|u32|s64|u64|pred)\[([\d,]*)\]')
_ITEM = dict(bf16=2, f16=2, f32=4, f64=8, s8=1, u8=1, s16=2, s32=4, u32=4, s64=8, u64=8, pred=1)


def _bytes(sig: str) -> int:
    total = 0
    for dt, dims in _SHAPE.findall(sig):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _ITEM[dt]
    return total


def part_of(op_name: str | None) -> str:
    """The model part of an op: its outermost named scope; for an argument, the module that owns it."""
    if not op_name:
        return "unmapped"
    if " (" in op_name:                            # resolved by HloIndex
        return op_name.split()[0]
    if op_name.startswith("params"):
        return next((p for k, p in _WEIGHT_PARTS if k in op_name), "weights")
    if op_name.startswith("state"):
        return "state"
    for c in op_name.split("/"):
        if c in PARTS:
            return c
    return "other"


class HloIndex:
    """op_name and bytes of every instruction of an optimized HLO module (compiled.as_text())."""

    def __init__(self, hlo_text: str):
        own, calls, operands, body, sig, size, groups, group_of, custom = {}, {}, {}, {}, {}, {}, {}, {}, set()
        comp = None
        for line in hlo_text.splitlines():
            h = _HEADER.match(line)
            if h:
                comp = h.group(1)
                sig[comp] = _bytes(h.group(2)) + _bytes(h.group(3))
                continue
            d = _DEF.match(line)
            if not d:
                continue
            name, rhs = d.groups()
            m = re.search(r'op_name="([^"]*)"', rhs)
            if m:
                own[name] = m.group(1)
                body.setdefault(comp, []).append(m.group(1))
            c = re.search(r'calls=%([\w.\-]+)', rhs)
            if c:
                calls[name] = c.group(1)
            dd = re.search(r'deduplicated_name="([^"]*)"', rhs)
            if dd:
                groups.setdefault(dd.group(1), []).append(name)
                group_of[name] = dd.group(1)
            operands[name] = re.findall(r'%([\w.\-]+)', rhs.split("metadata=")[0].split("calls=")[0])
            if " parameter(" in rhs:
                size[name] = _bytes(rhs.split(" parameter(")[0])
            if " custom-call(" in rhs:
                custom.add(name)
        self.size = size
        self.groups, self.group_of = groups, group_of
        self.own, self.calls, self.operands, self.body = own, calls, operands, body
        self.nbytes = {n: sig[c] for n, c in calls.items() if c in sig}
        self._memo: dict[str, str | None] = {}
        self.alias = {re.sub(r"[.\-]", "_", n): n for n in operands}
        # Pallas kernels are named by their pallas_call's `name` (op_name ".../<name>/pallas_call"), with "__N"
        # appended by Triton for a second compiled variant; inside a command buffer the trace gives only that.
        pallas: dict[str, list] = {}
        for n, on in own.items():
            parts = on.split("/")
            if len(parts) > 1 and parts[-1] == "pallas_call" and n in custom:
                pallas.setdefault(parts[-2], []).append(n)
        self.pallas = pallas
        self.pallas_of = {n: k for k, ns in pallas.items() for n in ns}

    def shares(self, name: str, classify=part_of) -> dict[str, float]:
        """XLA compiles identical fusions once and launches that kernel for each of them (metadata
        deduplicated_name), so a kernel name stands for every instruction of its group: the share of
        each part (or of each class `classify` gives an op_name) among them (exact on average, since the
        launches are the same kernel). A Pallas kernel's group is every pallas_call of that kernel name."""
        members = self.groups.get(self.group_of.get(name)) or self.pallas.get(self.pallas_of.get(name)) or [name]
        parts = collections.Counter(classify(self.op_name(m)) for m in members)
        return {p: c / len(members) for p, c in parts.items()}

    def name(self, kernel_or_op: str) -> str | None:
        """The HLO instruction of a trace name (an hlo_op, or a kernel named after its fusion)."""
        if kernel_or_op in self.operands:
            return kernel_or_op
        if kernel_or_op in self.alias:
            return self.alias[kernel_or_op]
        members = self.pallas.get(re.sub(r"__\d+$", "", kernel_or_op))
        return members[0] if members else None

    def _weights(self, name, depth=0):
        """(bytes, part) of the weight parameters reached through operands (bitcasts, copies)."""
        op = self.own.get(name, "")
        if op.startswith("params"):
            return [(self.size.get(name, 0), part_of(op))]
        if depth > 3:
            return []
        return [w for o in self.operands.get(name, []) for w in self._weights(o, depth + 1)]

    def _weight(self, name):
        """The part owning the largest weight an instruction reads (a gemm with the RMSNorm fused into
        its prologue also reads the norm's weight)."""
        ws = self._weights(name)
        return max(ws)[1] if ws else None

    def op_name(self, name: str, depth: int = 0) -> str | None:
        """Own metadata; else (XLA drops it on instructions it makes: copies, converts, rewritten dots)
        the part of the weight it reads, else the most common part inside the computation it calls,
        else that of its operands."""
        if name in self.own:
            return self.own[name]
        if name in self._memo or depth > 6:
            return self._memo.get(name)
        self._memo[name] = None

        def majority(ops):
            parts = [p for p in map(part_of, filter(None, ops)) if p in PARTS or p == "state"]
            return max(set(parts), key=parts.count) if parts else None

        if (p := self._weight(name)) is not None:
            res = f"{p} (reads its weight)"
        elif (p := majority(self.body.get(self.calls.get(name), []))) is not None:
            res = f"{p} (inside fusion)"
        elif (p := majority(self.op_name(o, depth + 1) for o in self.operands.get(name, []))) is not None:
            res = f"{p} (from operands {' '.join(self.operands[name][:3])})"
        else:
            res = None
        self._memo[name] = res
        return res


@contextlib.contextmanager
def trace(run_step, steps: int):
    """Trace `steps` calls of run_step (the last one waited for inside the trace); yields the xplane.pb
    path, or None where none was written. The trace directory is removed afterwards."""
    import jax
    tmp = tempfile.mkdtemp(prefix="bench_trace_")
    try:
        opts = jax.profiler.ProfileOptions()
        opts.python_tracer_level = 0   # keep the trace small: kernels and XLA annotations only
        opts.enable_hlo_proto = False
        with jax.profiler.trace(tmp, profiler_options=opts):
            for _ in range(steps):
                out = run_step()
            jax.block_until_ready(out)
        files = sorted(glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True))
        yield files[-1] if files else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def device_time(run_step, steps: int = 5) -> dict:
    """Device time per call: the kernels' summed durations in a trace of `steps` calls, over `steps`
    (on a machine without a device, the XLA thunks of the host). This is what a phase adds to a round
    of the engine's device loop, where the host enqueues it while the GPU works on the verify; a
    back-to-back timing of a small phase alone measures the host launching its ~200 kernels instead
    (accept + commit of 65 nodes at the real shape: 3.6 ms back to back, 0.88 ms of kernels,
    bench/results/2026-11-30-h200-verify-profile). The kernel benchmarks report it beside their synchronised
    wall time, which includes the host's launches. A call spread over several GPUs (tensor parallel) runs on
    them at once: its device time is the busiest GPU's, with `devices` beside it (summed over four GPUs, a
    TP = 4 verify read 52 ms for an 11.5 ms call, bench/results/2026-11-30-h200x4-tp-table/tp4.json)."""
    with trace(run_step, steps) as xplane:
        if xplane is None:
            return dict(error="no xplane.pb written")
        devices = device_numbers(xplane)
        per_device = [load_events(xplane, device=d)[0] for d in devices] if devices else [load_events(xplane)[0]]
    return busiest(per_device, steps)


def time_donated(fn, args, iters: int):
    """fn jitted with its first argument (a tuple of arrays) donated, as the engine's round loop carries its state:
    the first call's results on the host (fp32 numpy), the seconds it took (its compile), and `device_time` of
    `iters` calls, each fed the previous call's results. The caller's arrays are copied first, never donated."""
    step = jax.jit(fn, donate_argnums=0)
    t0 = time.perf_counter()
    got = [np.asarray(x.astype(jnp.float32)) for x in step(tuple(jnp.copy(x) for x in args[0]), *args[1:])]
    compile_s = time.perf_counter() - t0
    box = [tuple(jnp.copy(x) for x in args[0])]

    def run():
        box[0] = step(box[0], *args[1:])
        return box[0]
    return got, compile_s, device_time(run, iters)


def donated_timing(fn, args, iters: int, moved: int):
    """time_donated's results for a benchmark row: the first call's results, and {device_us, kernels, bytes (moved,
    the bytes a call must read and write), device_bytes_per_s (nan without a kernel in the trace), compile_s}."""
    got, compile_s, dev = time_donated(fn, args, iters)
    us = dev.get("device_ms", float("nan")) * 1e3
    return got, dict(device_us=us, kernels=dev.get("kernels"), bytes=moved,
                     device_bytes_per_s=moved / (us * 1e-6) if us > 0 else float("nan"), compile_s=compile_s)


def timing_text(t: dict) -> str:
    """donated_timing's numbers as a bench prints them."""
    return f"{t['device_us']:8.1f} us  {t['kernels']} kernels  {t['device_bytes_per_s'] / 1e12:5.2f} TB/s"


def busiest(per_device: list[list[tuple]], steps: int) -> dict:
    """device_ms / kernels per call of the device whose kernels took longest, from each device's events."""
    events = max(per_device, key=lambda ev: sum(e[1] for e in ev))
    out = dict(device_ms=sum(e[1] for e in events) / steps / 1e6, kernels=len(events) / steps)
    return out | (dict(devices=len(per_device)) if len(per_device) > 1 else {})


def device_numbers(xplane: str) -> list[int]:
    """The device numbers of a trace's device planes ('/device:GPU:3' -> 3); [] on a host-only trace."""
    from jax.profiler import ProfileData
    names = [p.name for p in ProfileData.from_file(xplane).planes if p.name.startswith("/device:")]
    return sorted({int(n.rsplit(":", 1)[-1]) for n in names if n.rsplit(":", 1)[-1].isdigit()})


def load_events(xplane: str, module: str | None = None,
                device: int | None = None) -> tuple[list[tuple[float, float, str, str]], dict]:
    """(start_ns, duration_ns, kernel name, hlo_op) of the device kernels of `module` in start order (of
    device number `device` only, e.g. one GPU of a tensor-parallel trace); on a machine with no device
    planes, the XLA thunks of the host CPU plane. The dict holds the events per line and the names of all the
    modules seen ("modules")."""
    from jax.profiler import ProfileData
    planes = list(ProfileData.from_file(xplane).planes)
    dev = [p for p in planes if p.name.startswith("/device:")
           and (device is None or p.name.rsplit(":", 1)[-1] == str(device))]
    info: dict = dict(lines={})
    out, modules = [], set()
    for pl in dev or [p for p in planes if p.name == "/host:CPU"]:
        for ln in pl.lines:
            evs = list(ln.events)
            info["lines"][f"{pl.name}|{ln.name}"] = len(evs)
            if dev and not ln.name.startswith("Stream"):     # 'XLA Ops'/'XLA Modules' repeat the kernels
                continue
            if not dev and ln.name == "python":
                continue
            for ev in evs:
                st = {k: v for k, v in ev.stats}
                op = st.get("hlo_op")
                if op is None and not dev:
                    continue
                if "hlo_module" in st:
                    modules.add(str(st["hlo_module"]))
                if module and "hlo_module" in st and module not in str(st["hlo_module"]):
                    continue
                out.append((float(ev.start_ns), float(ev.duration_ns), str(ev.name), str(op or "")))
    out.sort()
    info["modules"] = sorted(modules)       # every module the kernels (of `device`) belong to, `module` or not
    return out, info


def first_step(events, hlo: HloIndex):
    """The events up to and including the first lm_head kernel (for a trace whose last step was cut)."""
    for i, (_, _, name, op) in enumerate(events):
        if part_of(_op_name(hlo, name, op)) == "head" and "gemm" in name:
            return events[:i + 1]
    return events


def _op_name(hlo: HloIndex, kernel: str, hlo_op: str) -> str | None:
    # Inside a CUDA graph every kernel's hlo_op is the graph's (command_buffer_N): use the kernel name.
    for cand in ((kernel, hlo_op) if hlo_op.startswith("command_buffer") or not hlo_op else (hlo_op, kernel)):
        n = hlo.name(cand)
        if n is not None:
            return hlo.op_name(n)
    return None


def summarize(events, hlo: HloIndex, steps: int, top: int = 30, classify=part_of) -> dict:
    """Per step: kernel time, span and gaps; time, kernels and bytes by part (gemm / other kernels). `classify`
    maps an op_name to its part (part_of; bench.harness.stage_of charges a round's kernels to its stages)."""
    steps = max(steps, 1)
    per_kernel: dict[str, list] = {}
    for _, dur, name, op in events:
        k = per_kernel.setdefault(name, [0.0, 0, op])
        k[0] += dur
        k[1] += 1
    by_part: dict[str, dict] = {}
    rows = []
    for name, (dur, cnt, op) in per_kernel.items():
        on = _op_name(hlo, name, op)
        n = hlo.name(name) if hlo.name(name) is not None else hlo.name(op)
        shares = hlo.shares(n, classify) if n is not None else {classify(on): 1.0}
        if "trsm" in name or "MakeBatchPointers" in name:
            shares = {"gdn": 1.0}  # cuBLAS triangular solve of the delta rule: its kernels have no HLO name
        part = max(shares, key=shares.get)
        nbytes = hlo.nbytes.get(n, 0) if n else 0
        # cuBLAS's Hopper gemms (nvjet_*) carry no HLO name: gemm time of an unknown part, bytes unknown
        kind = "gemm" if "gemm" in name or name.startswith("nvjet") else "other"
        for pt, w in shares.items():
            p = by_part.setdefault(pt, dict(ms_per_step=0.0, kernels_per_step=0.0, gemm_ms=0.0, gemm_gb=0.0,
                                            other_ms=0.0))
            p["ms_per_step"] += w * dur / 1e6 / steps
            p["kernels_per_step"] += w * cnt / steps
            p[f"{kind}_ms"] += w * dur / 1e6 / steps
            if kind == "gemm":
                p["gemm_gb"] += w * nbytes * cnt / 1e9 / steps
        if len(shares) > 1:
            on = f"{on} [kernel shared: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()) + "]"
        rows.append(dict(kernel=name, part=part, op_name=on, ms_per_step=dur / 1e6 / steps, count_per_step=cnt / steps,
                         gb_per_step=nbytes * cnt / 1e9 / steps))
    for p in by_part.values():
        p["gemm_tb_s"] = p["gemm_gb"] / p["gemm_ms"] if p["gemm_ms"] else 0.0
    busy = sum(d for _, d, _, _ in events) / 1e6 / steps
    span = (events[-1][0] + events[-1][1] - events[0][0]) / 1e6 / steps if events else 0.0
    gemm_ms = sum(p["gemm_ms"] for p in by_part.values())
    gemm_gb = sum(p["gemm_gb"] for p in by_part.values())
    return dict(
        steps=steps, kernel_ms_per_step=busy, span_ms_per_step=span, gap_ms_per_step=span - busy,
        kernels_per_step=len(events) / steps, gemm_ms_per_step=gemm_ms, gemm_gb_per_step=gemm_gb,
        gemm_tb_s=gemm_gb / gemm_ms if gemm_ms else 0.0, other_kernels_ms_per_step=busy - gemm_ms,
        by_part=dict(sorted(by_part.items(), key=lambda kv: -kv[1]["ms_per_step"])),
        top_kernels=sorted(rows, key=lambda r: -r["ms_per_step"])[:top])


def read_hlo(path: str) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read()


def _refuse_unreadable(ap, xplane: str, hlo_path: str):
    """(the trace's plane names, the HLO text), or the parser's error naming the file that cannot be read as one
    (a missing file, a directory, the two swapped)."""
    from jax.profiler import ProfileData
    try:
        planes = [p.name for p in ProfileData.from_file(xplane).planes]
    except (RuntimeError, OSError) as e:
        ap.error(f"xplane {xplane}: not a readable xplane.pb trace ({str(e).splitlines()[0][:200]}); "
                 "the arguments are XPLANE HLO, in that order")
    try:
        hlo = read_hlo(hlo_path)
    except (OSError, UnicodeDecodeError, EOFError) as e:
        ap.error(f"hlo {hlo_path}: not a readable HLO text ({type(e).__name__}: {str(e)[:200]}); "
                 "the arguments are XPLANE HLO, in that order")
    if "HloModule" not in hlo:
        ap.error(f"hlo {hlo_path}: no HloModule in it; the arguments are XPLANE HLO (optimized HLO text), "
                 "in that order")
    return planes, hlo


def main(argv=None):
    """The summary printed; with --json, written too, with the commit, the date and the machine that analysed it
    (the trace's planes, which name its devices, beside them)."""
    ap = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("xplane", help="the trace (.xplane.pb, e.g. from jax.profiler.trace or bench.harness --dump-dir)")
    ap.add_argument("hlo", help="optimized HLO text of the profiled module (.txt or .txt.gz)")
    ap.add_argument("--steps", type=at_least(1), default=1, help="complete steps in the trace (default: %(default)s)")
    ap.add_argument("--first-step", action="store_true", help="keep only the first step (up to the lm_head)")
    ap.add_argument("--module", default=None, help="only the kernels of HLO modules whose name contains this "
                    "(default: every module in the trace)")
    ap.add_argument("--device", type=at_least(0), default=None,
                    help="only this device's kernels (a multi-GPU trace has one plane per GPU: needed there)")
    ap.add_argument("--top", type=at_least(0), default=25, help="longest kernels listed (default: %(default)s)")
    ap.add_argument("--json", default=None, help="write the summary here (with the commit, the machine and the date)")
    args = dispatch.parse_args(ap, argv)
    writable_file(ap, "--json", args.json)
    planes, text = _refuse_unreadable(ap, args.xplane, args.hlo)
    devices = [p for p in planes if p.startswith("/device:")]
    if args.device is not None and not any(p.rsplit(":", 1)[-1] == str(args.device) for p in devices):
        ap.error(f"--device {args.device}: the trace has no such device plane; "
                 + (f"its device planes: {', '.join(devices)}" if devices else
                    f"it has none (its planes: {', '.join(planes)}; a host-only trace: leave --device out)"))
    if args.device is None and len(devices) > 1:     # their kernels run at once: summed, busy would exceed span
        ap.error(f"the trace has {len(devices)} device planes ({', '.join(devices)}): choose one with --device N")
    hlo = HloIndex(text)
    events, info = load_events(args.xplane, args.module, args.device)
    if args.module and not events:
        ap.error(f"--module {args.module}: no kernels of such a module in the trace; its modules: "
                 + (", ".join(info["modules"]) or "none named"))
    if args.first_step:
        events, args.steps = first_step(events, hlo), 1
    s = summarize(events, hlo, args.steps, args.top)
    print(f"per step: {s['kernels_per_step']:.0f} kernels, busy {s['kernel_ms_per_step']:.3f} ms, span "
          f"{s['span_ms_per_step']:.3f} ms (gaps {s['gap_ms_per_step']:.3f}); gemms {s['gemm_ms_per_step']:.3f} ms for "
          f"{s['gemm_gb_per_step']:.2f} GB ({s['gemm_tb_s']:.2f} TB/s), other kernels {s['other_kernels_ms_per_step']:.3f} ms")
    print(f"{'part':8s} {'ms':>8s} {'kernels':>8s} {'gemm ms':>8s} {'gemm GB':>8s} {'TB/s':>6s} {'other ms':>8s}")
    for k, p in s["by_part"].items():
        print(f"{k:8s} {p['ms_per_step']:8.3f} {p['kernels_per_step']:8.0f} {p['gemm_ms']:8.3f} {p['gemm_gb']:8.3f} "
              f"{p['gemm_tb_s']:6.2f} {p['other_ms']:8.3f}")
    print("top kernels:")
    for r in s["top_kernels"]:
        print(f"  {r['ms_per_step']:7.3f} ms x{r['count_per_step']:<4.0f} {r['part']:7s} {r['kernel'][:40]:40s} "
              f"{(r['op_name'] or '')[:70]}")
    if args.json:
        import datetime
        import platform
        import socket

        from bench.harness import versions
        from jaxspec.provenance import git_info
        write_json(args.json, dict(s, xplane=args.xplane, hlo=args.hlo, steps=args.steps, module=args.module,
                                   device=args.device, planes=planes, git=git_info(), versions=versions(),
                                   machine=dict(host=socket.gethostname(), python=platform.python_version(),
                                                jaxspec_flags=dispatch.flags()),
                                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")))
    return s


if __name__ == "__main__":
    exit_with(main)
