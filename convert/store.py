"""Converted checkpoints: the Flax params in Orbax, next to the HF config and tokenizer files.

Layout of a converted dir:
    config.json         the HF config, copied byte for byte (jaxspec reads only this one config)
    jaxspec.json        what jaxspec wrote: format version, param dtype, source dir
    params/             Orbax checkpoint of the model state, a nested dict (list indices as "0", "1", ...)
    mtp.safetensors     (target) the raw `mtp.*` tensors of the source, when it had any
    tokenizer files     (target) copied when present

The machinery (`save`, `restore`) is shared by every model jaxspec converts; a `Kind` says what differs
between them (how the config is read, how the abstract model is built, which files travel along).
`TARGET` is defined here; the DFlash drafter's kind lives in convert/drafter.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx
from safetensors.numpy import save_file

from convert.hf import (CONVERTED_META, MTP_FILE, PARAMS, TARGET_FORMAT, CheckpointError, ShardingSpec,
                        abstract_params, assemble, has_mtp_tensors, load_mtp_tensors, load_target, resolve_sharding)
from jaxspec.config import load_target_config
from jaxspec.files import blocking_file, clear_leftovers, orbax_path_problem, real_dir, replace_dir, temp_sibling
from jaxspec.model import Qwen35, fuse_params, split_params

META = CONVERTED_META                          # "jaxspec.json"
DTYPES = ("float32", "bfloat16", "float16")   # what jaxspec.json's "dtype" may say
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")


class OutDirError(OSError):
    """`out_dir` (or the temp dir beside it) cannot be written: the message names the dir and the reason."""


class OutDirTaken(FileExistsError):
    """`out_dir` exists and may not be replaced (no overwrite, or it is not a previous conversion of this kind)."""


def _out_dir_error(out_dir: Path, e: OSError) -> OutDirError:
    reason = f"{e.strerror}: {e.filename}" if e.strerror and e.filename else (e.strerror or str(e))
    return OutDirError(f"{out_dir}: cannot be written: {reason}")


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of model that `save` / `restore` handle."""

    name: str                                   # "target", "drafter": for messages
    format: str                                 # jaxspec.json "format": a restore refuses any other kind's dir
    version: int
    # (model dir, dtype or None) -> config, exactly as the HF loader builds it: the saved model is checked
    # against it, and a restore builds its abstract model from it.
    load_config: Callable[[Path, str | None], Any]
    # config -> (graphdef, flat state of abstract variables), without allocating the params.
    abstract: Callable[[Any], tuple]
    files: tuple[str, ...] = ()                 # files besides config.json copied from the source when present
    writer: str = "save"                        # the function that writes this kind, for messages
    # Older versions a restore still reads: `old_layout(config, version, {param path: abstract array})` gives
    # the params such a version saved, from this version's; `upgrade(config, version, {param path: array},
    # sharding)` turns them into this version's (placed by the ShardingSpec `sharding`).
    old_versions: tuple[int, ...] = ()
    old_layout: Callable[[Any, int, dict], dict] | None = None
    upgrade: Callable[[Any, int, dict, Any], dict] | None = None


def _target_old_layout(cfg, version: int, abstract: dict) -> dict:
    """Versions 1 and 2 stored the checkpoint's separate kernels; version 3 fuses them (jaxspec/model.py `FUSED`)."""
    return split_params(cfg, abstract)


def _target_upgrade(cfg, version: int, values: dict, sharding) -> dict:
    """Version 1 stored the GDN's q|k|v channels (in_proj_qkv, conv1d) in HF order, version 2 by key-head group;
    both stored the kernels that version 3 fuses separately."""
    if version == 1:
        from convert.keys import gdn_channel_order, gdn_channels
        order = gdn_channel_order(*gdn_channels(cfg))
        for path, x in list(values.items()):
            if str(path[-1]) == "conv1d" or (len(path) > 1 and str(path[-2]) == "in_proj_qkv"):
                values[path] = jax.jit(lambda a: a[..., order], out_shardings=x.sharding)(x)
    return fuse_params(cfg, values, sharding=lambda path, shape: resolve_sharding(sharding, path, shape))


TARGET = Kind("target", TARGET_FORMAT, 3, lambda path, dtype: load_target_config(path, dtype=dtype),
              abstract_params, TOKENIZER_FILES, "save_converted", old_versions=(1, 2), old_layout=_target_old_layout,
              upgrade=_target_upgrade)


def _key(part) -> str:
    return str(part)


def _nest(flat: dict[tuple, object]) -> dict:
    """{path tuple: leaf} -> nested dict with string keys (what Orbax stores without surprises)."""
    out: dict = {}
    for path, leaf in flat.items():
        node = out
        for p in path[:-1]:
            node = node.setdefault(_key(p), {})
        node[_key(path[-1])] = leaf
    return out


def _flatten(nested: dict, prefix: tuple = ()) -> dict[tuple, object]:
    out = {}
    for k, v in nested.items():
        if isinstance(v, dict):
            out.update(_flatten(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def save_converted(model: Qwen35, out_dir: str | Path, hf_dir: str | Path, *, overwrite: bool = False,
                   include_mtp: bool = True, progress: bool = False) -> Path:
    """Write the target `model` (converted from `hf_dir`) to `out_dir`, atomically (see `save`); the raw
    `mtp.*` tensors of `hf_dir` go along unless `include_mtp=False`."""
    def write_mtp(tmp: Path):
        if include_mtp and has_mtp_tensors(hf_dir):
            save_file(load_mtp_tensors(hf_dir), str(tmp / MTP_FILE), metadata={"format": "pt"})

    return save(TARGET, model, out_dir, hf_dir, overwrite=overwrite, progress=progress, extra=write_mtp)


def save(kind: Kind, model, out_dir: str | Path, src_dir: str | Path, *, overwrite: bool = False,
         progress: bool = False, extra: Callable[[Path], None] | None = None) -> Path:
    """Write `model` (a `kind` model converted from the HF dir `src_dir`) to `out_dir`, atomically.

    Everything goes into a temporary dir next to `out_dir` that is renamed into place at the end, so
    `out_dir` is either the complete result or untouched; the temporary dir is removed on any failure, Ctrl-C
    and SIGTERM included, and what a killed write of the same `out_dir` left behind is cleared first
    (`check_out_dir`). An `out_dir` that links to a dir writes that dir. `check_out_dir` says which `out_dir` is
    refused; it runs here even when the CLI ran it before the load (a caller of the API may not have, and
    `out_dir` may have changed during a load of minutes). `extra(tmp_dir)` writes kind-specific files before the
    params.
    """
    out_dir, src_dir = real_dir(out_dir).absolute(), Path(src_dir)
    check_out_dir(kind, out_dir, {"source checkpoint": src_dir}, overwrite=overwrite)
    config_path = src_dir / "config.json"
    # The copied config.json is all a restore has to rebuild the model from, so it must describe this
    # model. Compared with the config the HF loader builds (for the target that includes the stop tokens
    # of generation_config.json, which is copied along), so a model loaded from `src_dir` always passes.
    src_cfg = kind.load_config(src_dir, model.cfg.dtype)
    if src_cfg != model.cfg:
        raise CheckpointError(_not_described(config_path, src_cfg, model))
    _check_params(kind, model, config_path)

    try:
        _write(kind, model, out_dir, src_dir, config_path, progress, extra, overwrite)
    except OutDirTaken:
        raise                     # `out_dir` appeared during the write: refused as before it
    except OSError as e:  # a read-only or full disk: the temp dir is gone, `out_dir` untouched
        if _reading(e, src_dir, out_dir):
            raise                 # the source could not be read: not OUT_DIR's fault
        raise _out_dir_error(out_dir, e) from e
    return out_dir


def _check_params(kind: Kind, model, config_path: Path) -> None:
    """Every param of `model` has the shape and dtype that its config implies (what a restore reads it as):
    otherwise the store would not restore, or not bit for bit."""
    _, flat = kind.abstract(model.cfg)
    want = {path: var.get_value() for path, var in flat}
    have = {path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(model))}
    name = lambda path: ".".join(map(_key, path))
    missing, extra = sorted(map(name, want.keys() - have.keys())), sorted(map(name, have.keys() - want.keys()))
    if missing or extra:
        raise CheckpointError(f"the model's params do not match {config_path}: missing {missing[:5]}, unexpected "
                              f"{extra[:5]}")
    for path, a in want.items():
        x = have[path]
        if tuple(x.shape) != tuple(a.shape) or x.dtype != a.dtype:
            raise CheckpointError(f"param {name(path)!r} is {x.dtype.name}{list(x.shape)}, but {config_path} in "
                                  f"{model.cfg.dtype} implies {a.dtype.name}{list(a.shape)}; not saved")


def _reading(e: OSError, src_dir: Path, out_dir: Path) -> bool:
    """Whether `e` names a file in the source checkpoint (a copy or read of it failed), not one being written (in
    `out_dir` or a temp dir beside it, which may lie inside the source dir)."""
    if e.filename is None:
        return False
    f = Path(e.filename).absolute()
    if any(p == out_dir or (p.parent == out_dir.parent and p.name.startswith(f".{out_dir.name}."))
           for p in (f, *f.parents)):
        return False
    return f.is_relative_to(src_dir.absolute())


def _write(kind: Kind, model, out_dir: Path, src_dir: Path, config_path: Path, progress: bool,
           extra: Callable[[Path], None] | None, overwrite: bool) -> None:
    """The writing half of `save`: a temp dir beside `out_dir`, renamed into place once complete. `out_dir` is
    checked again just before the rename: a dir that appeared there during the write is refused as `check_out_dir`
    refuses it."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(out_dir)
    threads = set(threading.enumerate())
    with _sigterm_raises() as hold:
        try:
            tmp.mkdir()
            shutil.copyfile(config_path, tmp / "config.json")
            for name in kind.files:
                if (src_dir / name).is_file():
                    shutil.copyfile(src_dir / name, tmp / name)
            if extra is not None:
                extra(tmp)
            if progress:
                print(f"convert: writing params to {out_dir / PARAMS}", file=sys.stderr, flush=True)
            _write_params(model, tmp / PARAMS)
            meta = {"format": kind.format, "version": kind.version, "dtype": model.cfg.dtype,
                    "source": str(src_dir.absolute())}
            (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
            with hold():
                if out_dir.exists() or out_dir.is_symlink():
                    _check_replaceable(kind, out_dir, overwrite)
                replace_dir(tmp, out_dir)
        except BaseException as e:
            with hold():
                _remove_written(tmp, threads if isinstance(e, (KeyboardInterrupt, SystemExit)) else None)
            raise


def _remove_written(tmp: Path, threads: set | None) -> None:
    """Remove the temp dir of a failed or interrupted write. An interrupt reaches the main thread only: Orbax's
    writer threads (those not in `threads`, the ones alive before the write) may still be writing into `tmp`, and
    would put files back into a dir being removed. So after an interrupt they are given up to WRITER_WAIT_S seconds
    to end first (`threads` None: a failure, which Orbax raised after its threads ended; no wait)."""
    deadline = time.monotonic() + WRITER_WAIT_S
    for t in set(threading.enumerate()) - threads if threads is not None else ():
        t.join(max(0.0, deadline - time.monotonic()))
    for _ in range(3):
        shutil.rmtree(tmp, ignore_errors=True)
        if not (tmp.exists() or tmp.is_symlink()):
            return
        time.sleep(0.1)


def _not_described(config_path: Path, cfg, model) -> str:
    """Why `config_path` (config `cfg`) does not describe `model`: the fields that differ; for a model in the
    tensor-parallel layout of jaxspec/sharding.py (loaded with mesh=: kv heads repeated, vocabulary padded), that
    the unsharded model is what is saved."""
    from jaxspec import sharding as S
    diff = "; ".join(f"{f.name} {getattr(cfg, f.name)!r} ({config_path.name}) vs {getattr(model.cfg, f.name)!r} "
                     "(model)" for f in dataclasses.fields(cfg)
                     if f.compare and getattr(cfg, f.name) != getattr(model.cfg, f.name))
    tp = S.model_tp_degree(model)
    if tp > 1 and S.tp_config(cfg, tp) == model.cfg:
        return (f"{config_path}: does not describe this model, which is in a {tp}-way tensor-parallel layout "
                f"({diff}): save the unsharded model (loaded without mesh=)")
    return f"{config_path}: does not describe this model: {diff}"


def check_out_dir(kind: Kind, out_dir: str | Path, protected: dict[str, str | Path], *, overwrite: bool) -> None:
    """Refuse an `out_dir` that a `kind` save must not write; the CLI calls it before loading anything.

    - `out_dir` is one of the `protected` dirs ({what: dir}: the source checkpoint, the --target dir) or a
      folder above one: replacing it would delete that dir (CheckpointError).
    - A path component above `out_dir` is a file, so `out_dir` cannot be created (CheckpointError).
    - `out_dir`'s path has a character Orbax's writer globs (`[`, `]`, a backslash) (CheckpointError).
    - `out_dir` exists and `overwrite` is false (OutDirTaken, a FileExistsError).
    - With `overwrite`, `out_dir` is replaced only when it is an empty dir or a previous conversion of the same
      kind (its jaxspec.json names `kind.format`): never a dir of other files, nor another kind's conversion
      (OutDirTaken).
    - No dir can be made beside `out_dir` (read-only, /proc, ...), where the save writes its temp dir: a probe dir
      is made and removed in the nearest existing folder above `out_dir` (OutDirError).
    What a killed write of `out_dir` left beside it is cleared before the checks that look at `out_dir`
    (jaxspec/files.py `clear_leftovers`: a previous `out_dir` that it had moved aside is put back, so it is
    refused as any existing one is). An `out_dir` that links to a dir is that dir.
    """
    out_dir = real_dir(out_dir).absolute()
    problem = orbax_path_problem(out_dir)
    if problem:
        raise CheckpointError(f"{out_dir}: {problem}")
    # Compared both as written (`..` folded) and with symlinks resolved.
    spellings = lambda p: {Path(os.path.abspath(p)), Path(p).resolve()}
    outs = spellings(out_dir)
    for what, path in protected.items():
        paths = spellings(path)
        if outs & paths:
            raise CheckpointError(f"{out_dir}: is the {what} dir itself; choose another output dir")
        if any(o in p.parents for o in outs for p in paths):
            raise CheckpointError(f"{out_dir}: is a folder above the {what} dir {Path(path).absolute()}; replacing "
                                  "it would delete that dir, choose another output dir")
    parent = blocking_file(out_dir, parents_only=True)
    if parent is not None:
        raise CheckpointError(f"{out_dir}: cannot be created: {parent} is not a directory")
    try:
        clear_leftovers(out_dir, "convert")
    except OSError as e:        # a leftover that cannot be put back (a read-only folder): OUT_DIR's error
        raise _out_dir_error(out_dir, e) from e
    if out_dir.exists() or out_dir.is_symlink():
        _check_replaceable(kind, out_dir, overwrite)
    _probe_writable(out_dir)


def _probe_writable(out_dir: Path) -> None:
    """Make and remove a dir where the save will make its first one: `out_dir`'s parent, or the nearest existing
    folder above it (the save creates the missing ones), so that an unwritable OUT_DIR fails before the load."""
    base = next((p for p in out_dir.parents if p.is_dir()), Path(out_dir.anchor))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{out_dir.name}.probe-", dir=base))
    except OSError as e:
        raise OutDirError(f"{out_dir}: cannot be written: no dir can be made in {base} ({e.strerror or e})") from None


def _check_replaceable(kind: Kind, out_dir: Path, overwrite: bool) -> None:
    """The part of `check_out_dir` for an `out_dir` that exists."""
    if not overwrite:
        raise OutDirTaken(f"{out_dir}: already exists (pass overwrite=True / --overwrite to replace it)")
    if not out_dir.is_dir():
        what = "a file" if out_dir.exists() else "a link to nothing"
        raise OutDirTaken(f"{out_dir}: not replaced: it is {what}, not a converted checkpoint dir")
    names = sorted(p.name for p in out_dir.iterdir())
    if not names:
        return
    if META not in names:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise OutDirTaken(f"{out_dir}: not replaced: it holds files ({shown}) but no {META}, so it is not a "
                          f"previous conversion; --overwrite replaces only an empty dir or a converted {kind.name} dir")
    try:
        found = json.loads((out_dir / META).read_text()).get("format")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise OutDirTaken(f"{out_dir}: not replaced: its {META} is unreadable ({type(e).__name__}), so it may "
                          "not be a previous conversion") from None
    if found != kind.format:
        raise OutDirTaken(f"{out_dir}: not replaced: it holds format {found!r} ({META}), not a converted "
                          f"{kind.name} ({kind.format!r}); remove it yourself or choose another output dir")


@contextlib.contextmanager
def _sigterm_raises():
    """While inside, SIGTERM raises SystemExit(143) (128 + SIGTERM, the status of a process it kills), so that
    the cleanup of `save` runs instead of the process dying with its temp dir left behind. Yields `hold`: a
    SIGTERM or SIGINT (Ctrl-C) during a `with hold():` block is raised at its end (SystemExit(143),
    KeyboardInterrupt), so that the renames of `replace_dir` and the removal of the dir it replaced are never
    split. Only in the main thread (where Python runs signal handlers) and only for a signal with its default
    action: a handler the program set, or an ignored signal, is left alone. The previous handlers are restored."""
    defaults = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
    ours = [sig for sig, default in defaults.items()
            if threading.current_thread() is threading.main_thread() and signal.getsignal(sig) is default]
    state = {"held": False, "pending": None}

    def raise_for(signum):
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def handler(signum, frame):
        if state["held"]:
            state["pending"] = state["pending"] or signum
        else:
            raise_for(signum)

    @contextlib.contextmanager
    def hold():
        state["held"] = True
        try:
            yield
        finally:
            state["held"] = False
        if state["pending"] is not None:
            raise_for(state["pending"])

    previous = {sig: signal.signal(sig, handler) for sig in ours}
    try:
        yield hold
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


# Host memory in flight while saving / restoring: the params are as large as the host RAM of many
# machines (54 GB), so they must stream through in pieces rather than be staged all at once.
SAVE_HOST_GB = 4
RESTORE_HOST_GB = 8
# Seconds an interrupted write waits for Orbax's writer threads before removing its temp dir (`_remove_written`).
WRITER_WAIT_S = 30.0


def _write_params(model: nnx.Module, path: Path):
    values = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(model))}
    need, free = sum(x.nbytes for x in values.values()), shutil.disk_usage(path.parent).free
    if need > free:     # before minutes of writing, not at the end of them (Orbax's own error is a long traceback)
        raise OSError(errno.ENOSPC, f"no space left: the params take {need / 1e9:.2f} GB, {free / 1e9:.2f} GB are free "
                      "in", str(path.parent))
    try:
        write_tree(values, path)
    except (ValueError, RuntimeError) as e:  # TensorStore's write errors (a full disk, a quota) are ValueErrors
        raise OSError(errno.EIO, f"writing the params failed ({_cause(e)[1]})") from e
    _check_written(path, values)


def _check_written(path: Path, values: dict) -> None:
    """Orbax's metadata in the written `path` lists every param: a save that reported success but wrote an
    incomplete checkpoint is caught here, not by a later restore."""
    try:
        with ocp.StandardCheckpointer() as ckptr:
            stored = _stored_params(ckptr, path)
    except CheckpointError as e:
        raise OSError(errno.EIO, f"Orbax wrote an incomplete checkpoint ({e})") from None
    if set(stored) != {tuple(map(_key, p)) for p in values}:
        raise OSError(errno.EIO, "Orbax wrote an incomplete checkpoint (params missing)")


def _stored_params(ckptr, params: Path) -> dict:
    """{param path of string keys: its stored metadata (shape, dtype)} from the Orbax checkpoint `params`."""
    try:
        tree = getattr(ckptr.metadata(params).item_metadata, "tree", None)
    except Exception as e:  # Orbax raises many types for a damaged dir
        raise CheckpointError(f"{params}: cannot read the Orbax checkpoint ({_cause(e)[1]})") from None
    if tree is None:
        raise CheckpointError(f"{params}: no readable Orbax metadata; the checkpoint is damaged or incomplete")
    return _flatten(tree)


def write_tree(values: dict, path: Path):
    """{param path: array} as the Orbax checkpoint `path` (a `params/` dir)."""
    tree = _nest(values)
    # Synchronous, with bounded device-to-host staging; StandardCheckpointer reads the result.
    handler = ocp.PyTreeCheckpointHandler(save_device_host_concurrent_gb=SAVE_HOST_GB)
    with ocp.Checkpointer(handler) as ckptr:
        ckptr.save(path, args=ocp.args.PyTreeSave(tree))


def is_converted(path: str | Path) -> bool:
    return (Path(path) / PARAMS).is_dir()


def restore_converted(out_dir: str | Path, *, dtype: str | None = None, sharding: ShardingSpec = None,
                      mesh=None, progress: bool | None = None) -> Qwen35:
    """The target from a converted dir, restored straight into `dtype` (default: the dtype it was saved
    in) and `sharding` (a Sharding, or a function (param path, shape) -> Sharding), or tensor/data
    parallel on `mesh` (jaxspec/sharding.py; instead of `sharding`). progress: as `restore`'s."""
    return restore(TARGET, out_dir, dtype=dtype, sharding=sharding, mesh=mesh, progress=progress)


def restore(kind: Kind, out_dir: str | Path, *, dtype: str | None = None, sharding: ShardingSpec = None,
            mesh=None, progress: bool | None = None):
    """The `kind` model from a dir written by `save`. Orbax reads every array straight into `dtype` and
    its sharding, so the params are never held in the saved dtype first. With a `mesh`, every device
    reads only its own shard; the few params whose tp layout differs from the saved one (kv heads
    repeated, vocabulary padded) are restored split on their other axes and rearranged on the devices.
    progress: a line on stderr before the read and one after (default: for params over 1 GB on disk; Orbax reads
    them in one call, minutes for a 27B target)."""
    out_dir = Path(out_dir).absolute()
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    params = out_dir / PARAMS
    if not params.is_dir():
        raise CheckpointError(f"{out_dir}: not a converted checkpoint (no {PARAMS}/ dir)")
    meta = _read_meta(out_dir, kind)
    cfg = kind.load_config(out_dir, dtype or meta["dtype"])
    graphdef, flat = kind.abstract(cfg)
    abstract = {path: var.get_value() for path, var in flat}
    if meta["version"] != kind.version:
        abstract = kind.old_layout(cfg, meta["version"], abstract)
    if mesh is not None:
        from jaxspec import sharding as S
        if sharding is not None:
            raise ValueError("pass either sharding= or mesh=, not both")
        S.check_target(cfg, S.tp_degree(mesh)) if kind is TARGET else S.check_drafter(cfg, S.tp_degree(mesh))
        sharding = S.base_sharding(mesh, cfg)

    size = sum(f.stat().st_size for f in params.rglob("*") if f.is_file()) if progress is not False else 0
    report = size > 2**30 if progress is None else progress
    with ocp.StandardCheckpointer(restore_concurrent_gb=RESTORE_HOST_GB) as ckptr:
        stored = _stored_params(ckptr, params)
        want = {tuple(map(_key, p)): (p, a) for p, a in abstract.items()}
        missing = sorted(".".join(k) for k in want if k not in stored)
        extra = sorted(".".join(k) for k in stored if k not in want)
        if missing or extra:
            raise CheckpointError(f"{params}: saved params do not match the model of {out_dir / 'config.json'}: "
                                  f"missing {missing[:5]}, unexpected {extra[:5]}")
        saved_dtype = jnp.dtype(meta["dtype"])    # every param is stored in it (`save` checks)
        for k, (p, a) in want.items():
            if tuple(stored[k].shape) != tuple(a.shape):
                raise CheckpointError(f"{params}: param {'.'.join(k)!r} has shape {list(stored[k].shape)}, but "
                                      f"{out_dir / 'config.json'} implies {list(a.shape)}")
            if jnp.dtype(stored[k].dtype) != saved_dtype:
                raise CheckpointError(f"{params}: param {'.'.join(k)!r} is stored as {jnp.dtype(stored[k].dtype)}, "
                                      f"but {out_dir / META} says {meta['dtype']}")
        target = _nest({k: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=resolve_sharding(sharding, p, a.shape))
                        for k, (p, a) in want.items()})
        if report:      # after the checks: an error line is the only line a damaged checkpoint gives
            unit, scale = ("GB", 1e9) if size >= 1e9 else ("MB", 1e6)
            print(f"convert: restoring {params} ({size / scale:.2f} {unit} on disk) as {cfg.dtype}",
                  file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            restored = _flatten(ckptr.restore(params, target))
        except Exception as e:
            key, why = _cause(e)
            raise CheckpointError(f"{params}: cannot restore the Orbax checkpoint, it is damaged"
                                  f"{f': param {key!r}' if key else ''} ({why})") from None
    values = {p: restored[k] for k, (p, _) in want.items()}
    if meta["version"] != kind.version:
        values = kind.upgrade(cfg, meta["version"], values, sharding)
    if mesh is not None:
        graphdef, flat, values = S.to_tp_layout(kind.abstract, cfg, mesh, values)
    model = assemble(graphdef, flat, values)
    if report:
        print(f"convert: restored {len(want)} params in {time.perf_counter() - t0:.1f}s", file=sys.stderr,
              flush=True)
    return model


# TensorStore's error on a read names the param's key in the OCDBT database: `Error reading "KEY/CHUNK" ...`, where
# KEY is the param path joined by "." and CHUNK the chunk's grid index ("0.0").
_READING = re.compile(r'Error reading "([^"/]+)(?:/[0-9.]*)?"')


def _first_line(e: BaseException, limit: int = 300) -> str:
    # The first line, cut before "See full TensorStore details:": Orbax's error on a failed read goes on with the
    # repr of a bound method holding the whole TensorStore spec, over many lines. It names only the array index;
    # the param and what went wrong are in the error it was raised from (`_cause`).
    text = str(e).strip().splitlines()
    return text[0].split(" See full TensorStore details")[0][:limit] if text else ""


def _cause(e: BaseException) -> tuple[str | None, str]:
    """(the param an Orbax read error is about, None where no error says; "Type: what went wrong" in a line).
    Orbax raises its own error from TensorStore's, which names the param's key and the cause (`ValueError:
    FAILED_PRECONDITION: Error reading "embed_tokens/0.0" in OCDBT database ...: Truncated Zstd-compressed
    stream`), so the chain (__cause__, else __context__) is walked for it."""
    chain, x = [], e
    while x is not None and all(x is not c for c in chain):
        chain.append(x)
        x = x.__cause__ or x.__context__
    for x in chain:
        m = _READING.search(str(x))
        if m:
            return m.group(1), f"{type(x).__name__}: {_first_line(x)}"
    return None, f"{type(e).__name__}: {_first_line(e)}"


def _read_meta(out_dir: Path, kind: Kind) -> dict:
    path = out_dir / META
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; {out_dir} was not written by {kind.writer}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    if meta.get("format") != kind.format or meta.get("version") not in (kind.version,) + kind.old_versions:
        # The likely slip is a converted target passed as the drafter or the other way round: say so.
        raise CheckpointError(f"{path}: format {meta.get('format')!r} version {meta.get('version')!r}, "
                              f"expected {kind.format!r} version {kind.version} ({out_dir} is not a converted "
                              f"{kind.name} checkpoint)")
    if meta.get("dtype") not in DTYPES:
        raise CheckpointError(f"{path}: dtype {meta.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    return meta


def load_model(path: str | Path, *, dtype: str | None = None, sharding: ShardingSpec = None,
               progress: bool | None = None, mesh=None) -> Qwen35:
    """The target from either a converted dir (has `params/`) or a HF checkpoint dir; with a `mesh`,
    tensor/data parallel, each device reading only its shard. progress: lines on stderr (default: for weights
    over 1 GB)."""
    path = Path(path)
    if is_converted(path):
        return restore_converted(path, dtype=dtype, sharding=sharding, mesh=mesh, progress=progress)
    return load_target(path, dtype=dtype, sharding=sharding, progress=progress, mesh=mesh)
