"""Load a Hugging Face Qwen3.5/3.6 checkpoint (single or sharded safetensors) into the Flax model.

Loading is two passes. The first reads only the safetensors headers (cheap, even for 55 GB) and checks
the whole checkpoint against config.json, so a bad checkpoint fails in seconds with a message that
names the file and the key, before anything is put on a device. The second converts one tensor at a
time: read it from the (memory-mapped) file, put it on the device, transpose and cast there into the
target dtype and sharding, then drop the host copy. At no point is the checkpoint held twice.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Union

import jax
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open

from convert.keys import IGNORED_PREFIXES, MTP_PREFIX, strip_text_prefix, target_layout, transform
from jaxspec.config import FULL, TargetConfig, load_json, load_target_config
from jaxspec.model import Qwen35, fuse_params, split_params

INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "model.safetensors"   # the single-file layout, which transformers prefers to an index beside it
CONVERTED_META = "jaxspec.json"      # what convert/store.py writes into a converted dir (store.META)
PARAMS = "params"                    # a converted dir's Orbax params (convert/store.py)
TARGET_FORMAT, DRAFTER_FORMAT = "jaxspec-target", "jaxspec-drafter"   # its "format": store.TARGET, drafter.DRAFTER
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# Stored dtypes we can convert; anything else is a quantized or otherwise foreign checkpoint.
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")

# A single Sharding for every parameter, or a function (param path, shape) -> Sharding.
ShardingSpec = Union[jax.sharding.Sharding, Callable[[tuple, tuple], jax.sharding.Sharding], None]


class CheckpointError(ValueError):
    """A checkpoint jaxspec refuses to load; the message names the file and the key."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    key: str              # the key exactly as stored
    file: Path
    shape: tuple[int, ...]
    dtype: str            # safetensors dtype string, e.g. "BF16"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _ITEMSIZE.get(self.dtype, 1)


_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
             "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


# ----------------------------------------------------------------------------------------------
# Finding and reading the files


def _refuse_pickle(path: Path, found: Iterable[str]) -> CheckpointError:
    return CheckpointError(
        f"{path}: only pickle checkpoints found ({', '.join(sorted(found))}). jaxspec never loads them: "
        "unpickling runs arbitrary code embedded in the file. Convert them to safetensors with a trusted "
        "tool first (e.g. transformers' save_pretrained(..., safe_serialization=True)).")


def refuse_converted(model_dir: Path) -> None:
    """A dir that `python -m convert` wrote (it has jaxspec.json) given where a Hugging Face checkpoint is expected:
    say that it is converted already and how to load it, rather than report its files as a broken checkpoint."""
    meta = model_dir / CONVERTED_META
    if not meta.is_file():
        return
    try:
        fmt = json.loads(meta.read_text()).get("format")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        fmt = None
    if not (model_dir / PARAMS).is_dir():     # what an interrupted copy of a converted dir leaves
        raise CheckpointError(f"{model_dir}: an incomplete converted checkpoint: it has {CONVERTED_META} (format "
                              f"{fmt!r}) but no params/ dir (a partial copy?); copy it again, or convert again")
    target = f"convert.load_model({str(model_dir)!r}) or `python -m jaxspec.generate --model {model_dir}`"
    drafter = f"convert.load_draft({str(model_dir)!r}) or `python -m jaxspec.generate --draft {model_dir}`"
    how = {TARGET_FORMAT: target, DRAFTER_FORMAT: drafter}.get(
        fmt, f"{target} (a target), {drafter} (a drafter)")
    raise CheckpointError(f"{model_dir}: already converted by jaxspec (it has {CONVERTED_META}, format {fmt!r}), "
                          f"not a Hugging Face checkpoint; there is nothing to convert: load it directly with {how}")


def shard_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint dir: the shards its index lists, else every *.safetensors."""
    model_dir = Path(model_dir)
    if model_dir.is_file():
        if model_dir.suffix in PICKLE_SUFFIXES:
            raise _refuse_pickle(model_dir, [model_dir.name])
        raise CheckpointError(f"{model_dir}: expected a checkpoint directory (with config.json), got a file")
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: no such checkpoint directory")
    refuse_converted(model_dir)
    index = model_dir / INDEX_NAME
    if index.exists():
        shards = sorted(set(_read_index(index).values()))
        single = model_dir / WEIGHTS_NAME
        # transformers loads model.safetensors and ignores the index; loading the index's shards instead would
        # give another model from the same dir.
        if single.is_file() and single not in shards:
            raise CheckpointError(f"{model_dir}: holds both {WEIGHTS_NAME} and {INDEX_NAME}, which does not list "
                                  f"it: which of them is the checkpoint is ambiguous (transformers would load "
                                  f"{WEIGHTS_NAME}); remove the stale one")
        return shards
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        return files
    pickles = [p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES or p.name.endswith(".bin.index.json")]
    if pickles:
        raise _refuse_pickle(model_dir, pickles)
    raise CheckpointError(f"{model_dir}: no *.safetensors files and no {INDEX_NAME}")


def _read_index(index: Path) -> dict[str, Path]:
    """key -> shard path, from a model.safetensors.index.json; every shard must exist in the same dir."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{index}: not a valid safetensors index ({type(e).__name__}: {e})") from None
    out, missing = {}, {}
    for key, name in weight_map.items():
        # A shard name is a plain file name next to the index; anything else could read outside the dir.
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise CheckpointError(f"{index}: key {key!r} points to {name!r}, which is not a file name in "
                                  f"{index.parent}")
        if Path(name).suffix in PICKLE_SUFFIXES:
            raise _refuse_pickle(index, [name])
        path = index.parent / name
        if not path.is_file():
            missing.setdefault(name, key)
        out[key] = path
    if missing:
        listed = ", ".join(f"{n} (e.g. for {k!r})" for n, k in sorted(missing.items()))
        raise CheckpointError(f"{index}: lists shard(s) that are missing from {index.parent}: {listed}")
    return out


def _open(file: Path):
    try:
        return safe_open(str(file), framework="numpy")
    except SafetensorError as e:
        raise CheckpointError(f"{file}: corrupt or truncated safetensors file ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read ({e})") from None


def scan(model_dir: str | Path) -> dict[str, TensorInfo]:
    """Every tensor in the checkpoint from the headers alone: key -> TensorInfo. Checks that the index
    (if any) and the shards agree and that no key is stored twice."""
    model_dir = Path(model_dir)
    files = shard_files(model_dir)
    index = model_dir / INDEX_NAME
    listed = _read_index(index) if index.exists() else None
    infos: dict[str, TensorInfo] = {}
    for f in files:
        with _open(f) as sf:
            for key in sf.keys():
                sl = sf.get_slice(key)
                info = TensorInfo(key, f, tuple(int(s) for s in sl.get_shape()), str(sl.get_dtype()))
                if key in infos:
                    raise CheckpointError(f"{f}: tensor {key!r} is stored twice (also in {infos[key].file})")
                if listed is not None and listed.get(key) != f:
                    where = f"lists it in {listed[key].name}" if key in listed else "does not list it"
                    raise CheckpointError(f"{f}: holds tensor {key!r} but {index.name} {where}")
                infos[key] = info
    if listed is not None:
        absent = sorted(k for k in listed if k not in infos)
        if absent:
            raise CheckpointError(f"{index}: lists tensor {absent[0]!r} in {listed[absent[0]].name}, but that "
                                  f"file does not contain it ({len(absent)} such key(s))")
    return infos


def _read(info: TensorInfo, handles: dict) -> np.ndarray:
    sf = handles.get(info.file)
    if sf is None:
        sf = handles[info.file] = _open(info.file).__enter__()
    try:
        return sf.get_tensor(info.key)
    except SafetensorError as e:
        raise CheckpointError(f"{info.file}: cannot read tensor {info.key!r} ({e})") from None


def _close(handles: dict):
    for sf in handles.values():
        sf.__exit__(None, None, None)
    handles.clear()


# ----------------------------------------------------------------------------------------------
# Checking a checkpoint against its config


_SHAPE_FIELDS = {
    "embed_tokens": ("vocab_size", "hidden_size"), "lm_head": ("vocab_size", "hidden_size"),
    "norm": ("hidden_size",), "input_layernorm": ("hidden_size",), "post_attention_layernorm": ("hidden_size",),
    "mlp": ("intermediate_size", "hidden_size"),
    "q_proj": ("num_attention_heads", "head_dim", "hidden_size"),
    "k_proj": ("num_key_value_heads", "head_dim", "hidden_size"),
    "v_proj": ("num_key_value_heads", "head_dim", "hidden_size"),
    "o_proj": ("num_attention_heads", "head_dim", "hidden_size"),
    "q_norm": ("head_dim",), "k_norm": ("head_dim",),
    "in_proj_qkv": ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
                    "linear_value_head_dim", "hidden_size"),
    "in_proj_z": ("linear_num_value_heads", "linear_value_head_dim", "hidden_size"),
    "in_proj_b": ("linear_num_value_heads", "hidden_size"), "in_proj_a": ("linear_num_value_heads", "hidden_size"),
    "dt_bias": ("linear_num_value_heads",), "A_log": ("linear_num_value_heads",),
    "conv1d": ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim",
               "linear_conv_kernel_dim"),
    "linear_attn.norm": ("linear_value_head_dim",),
    "out_proj": ("linear_num_value_heads", "linear_value_head_dim", "hidden_size"),
}


def _hint_fields(name: str, cfg: TargetConfig) -> str:
    """The config.json fields a text tensor's shape is computed from, with their values."""
    c = cfg
    values = {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
              "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
              "linear_num_key_heads": c.linear_num_key_heads, "linear_num_value_heads": c.linear_num_value_heads,
              "linear_key_head_dim": c.linear_key_head_dim, "linear_value_head_dim": c.linear_value_head_dim,
              "linear_conv_kernel_dim": c.conv_kernel}
    parts = name.split(".")
    module = parts[-2] if parts[-1] == "weight" and len(parts) > 1 else parts[-1]
    if module == "norm" and "linear_attn" in parts:  # the gated per-head norm, not a hidden-size norm
        module = "linear_attn.norm"
    if len(parts) > 2 and parts[-3] == "mlp":
        module = "mlp"
    fields = _SHAPE_FIELDS.get(module)
    return ", ".join(f"{f}={values[f]}" for f in fields) if fields else "the config"


_LAYER = re.compile(r"^layers\.(\d+)\.(self_attn|linear_attn)?")


def check_against_config(cfg: TargetConfig, text: dict[str, TensorInfo], config_path: Path,
                         model_dir: Path) -> None:
    """Raise a CheckpointError naming the file, the key and the config field for the first way in
    which the text tensors (name without prefix -> info) do not fit the config."""
    layout = target_layout(cfg)
    emb = text.get("embed_tokens.weight")
    if emb is not None and len(emb.shape) == 2:
        for axis, field, want in ((1, "hidden_size", cfg.hidden_size), (0, "vocab_size", cfg.vocab_size)):
            if emb.shape[axis] != want:
                raise CheckpointError(
                    f"{config_path}: {field}={want} does not match the weights: {emb.key!r} in {emb.file} has "
                    f"shape {list(emb.shape)}, i.e. {field} {emb.shape[axis]}")

    # Layer structure before shapes: one wrong count or type would otherwise show up as dozens of
    # unexpected or missing tensors.
    kinds: dict[int, dict[str, TensorInfo]] = {}
    for name, info in text.items():
        m = _LAYER.match(name)
        if m:
            kinds.setdefault(int(m.group(1)), {})
            if m.group(2):
                kinds[int(m.group(1))].setdefault(m.group(2), info)
    if kinds and max(kinds) >= cfg.num_layers:
        i = max(kinds)
        info = next(iter(kinds[i].values()), None) or next(v for n, v in text.items() if n.startswith(f"layers.{i}."))
        raise CheckpointError(
            f"{config_path}: num_hidden_layers={cfg.num_layers} does not match the weights: the checkpoint has "
            f"decoder layer {i} ({info.key!r} in {info.file})")
    if kinds and max(kinds) + 1 < cfg.num_layers:
        raise CheckpointError(
            f"{config_path}: num_hidden_layers={cfg.num_layers} does not match the weights: the checkpoint in "
            f"{model_dir} has only decoder layers 0..{max(kinds)}")
    for i, mixers in sorted(kinds.items()):
        want = "self_attn" if cfg.layer_types[i] == FULL else "linear_attn"
        for mixer, info in mixers.items():
            if mixer != want:
                raise CheckpointError(
                    f"{config_path}: layer_types[{i}]={cfg.layer_types[i]!r} does not match the weights: "
                    f"{info.key!r} in {info.file} is a "
                    f"{'full-attention' if mixer == 'self_attn' else 'linear-attention (GDN)'} weight")

    unexpected = [info for name, info in text.items() if name not in layout]
    if unexpected:
        extra = "" if len(unexpected) == 1 else f" (and {len(unexpected) - 1} more: " + ", ".join(
            repr(u.key) for u in unexpected[1:6]) + (" ..." if len(unexpected) > 6 else "") + ")"
        hint = ""
        if unexpected[0].key == "lm_head.weight" and cfg.tie_word_embeddings:
            hint = f" ({config_path} has tie_word_embeddings=true, so there is no separate lm_head)"
        raise CheckpointError(f"{unexpected[0].file}: unexpected tensor {unexpected[0].key!r}{hint}: it is not "
                              f"part of the model that {config_path} describes{extra}")

    missing = [name for name in layout if name not in text]
    if missing:
        prefix = _text_prefix(text)
        keys = [n if n == "lm_head.weight" else prefix + n for n in missing]
        hint = ""
        if "lm_head.weight" in missing and not cfg.tie_word_embeddings:
            hint = f" ({config_path} has tie_word_embeddings=false, so lm_head.weight is required)"
        where = model_dir / INDEX_NAME if (model_dir / INDEX_NAME).exists() else model_dir
        raise CheckpointError(f"{where}: missing {len(keys)} tensor(s) that {config_path} requires: "
                              f"{', '.join(map(repr, keys[:8]))}{' ...' if len(keys) > 8 else ''}{hint}")

    for name, info in text.items():
        shape = layout[name][1]
        if info.shape != shape:
            raise CheckpointError(
                f"{info.file}: tensor {info.key!r} has shape {list(info.shape)}, but {config_path} implies "
                f"{list(shape)} (from {_hint_fields(name, cfg)})")
        if info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(
                f"{info.file}: tensor {info.key!r} is stored as {info.dtype}; jaxspec converts floating-point "
                f"checkpoints only ({', '.join(FLOAT_DTYPES)}), not quantized ones")


def _text_prefix(text: dict[str, TensorInfo]) -> str:
    for name, info in text.items():
        if name != "lm_head.weight":
            return info.key[: len(info.key) - len(name)]
    return "model."


# Tensor names only quantized checkpoints have: FP8 block scales, compressed-tensors / ModelOpt scales, GPTQ / AWQ
# packed weights, bitsandbytes' quantization state.
_QUANT_SUFFIXES = ("_scale_inv", ".weight_scale", ".input_scale", ".qweight", ".qzeros", ".scales", ".g_idx",
                   ".absmax", ".quant_map", ".quant_state")


def refuse_quantized(config_path: Path, infos: dict[str, TensorInfo]) -> None:
    """Refuse a quantized checkpoint, named by config.json's quantization_config or else by its scale or packed-weight
    tensors, before those extra tensors would be reported as unexpected ones."""
    why = (f"jaxspec converts floating-point checkpoints only ({', '.join(FLOAT_DTYPES)}), not quantized ones; use "
           "the unquantized (BF16) release of the model")
    hf = load_json(config_path) if config_path.is_file() else {}
    for section in (hf, hf.get("text_config")):
        q = section.get("quantization_config") if isinstance(section, dict) else None
        if q:
            method = q.get("quant_method") if isinstance(q, dict) else None
            raise CheckpointError(f"{config_path}: a quantized checkpoint (quantization_config with quant_method "
                                  f"{method!r}): {why}")
    for key, info in infos.items():
        if key.endswith(_QUANT_SUFFIXES):
            raise CheckpointError(f"{info.file}: tensor {key!r} ({info.dtype}) is a quantization tensor, so this is "
                                  f"a quantized checkpoint: {why}")


def text_tensors(infos: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """name without the text prefix -> info, for the text-model tensors. `model.visual.*` and `mtp.*`
    are skipped; any other key that is not a text weight is an error (the checkpoint is not what we
    think it is)."""
    text: dict[str, TensorInfo] = {}
    for key, info in infos.items():
        name = strip_text_prefix(key)
        if name is None:
            if key.startswith(IGNORED_PREFIXES):
                continue
            raise CheckpointError(f"{info.file}: unexpected tensor {key!r}: not a Qwen3.5/3.6 text, vision "
                                  f"or MTP weight")
        if name in text:
            raise CheckpointError(f"{info.file}: tensor {key!r} duplicates {text[name].key!r} "
                                  f"(in {text[name].file}): the checkpoint mixes two key layouts")
        text[name] = info
    return text


# ----------------------------------------------------------------------------------------------
# Building the model


def abstract_model(cfg: TargetConfig):
    return nnx.eval_shape(lambda: Qwen35(cfg, rngs=nnx.Rngs(0)))


def abstract_params(cfg: TargetConfig):
    """(graphdef, flat state of abstract variables) of the model, without allocating it."""
    graphdef, state = nnx.split(abstract_model(cfg))
    return graphdef, nnx.to_flat_state(state)


def assemble(graphdef, flat, values: dict[tuple, jax.Array]) -> Qwen35:
    """The model from `abstract_params` and a value for every state path."""
    for path, var in flat:
        var.set_value(values[path])
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def resolve_sharding(sharding: ShardingSpec, path: tuple, shape: tuple) -> jax.sharding.Sharding:
    if sharding is None:
        return jax.sharding.SingleDeviceSharding(jax.devices()[0])
    if isinstance(sharding, jax.sharding.Sharding):
        return sharding
    return sharding(path, shape)


@functools.lru_cache(maxsize=None)
def _converter(kind: str, dtype, sharding):
    # Transpose and cast on the device, where it is fast; jit caches one program per shape.
    return jax.jit(lambda x: transform(x, kind).astype(dtype), out_shardings=sharding)


class Progress:
    """One line to stderr per shard and every `every` tensors: conversions of 55 GB take minutes."""

    def __init__(self, total_bytes: int, n_files: int, enabled: bool, every: int = 64, stream=None):
        self.total, self.n_files, self.enabled, self.every = total_bytes, n_files, enabled, every
        self.stream = stream or sys.stderr
        self.done = self.count = 0
        self.t0 = time.perf_counter()

    def tensor(self, info: TensorInfo, file_no: int):
        self.done += info.nbytes
        self.count += 1
        if self.enabled and self.count % self.every == 0:
            self._line(f"{self.count} tensors", info.file, file_no)

    def file_done(self, file: Path, file_no: int):
        if self.enabled:
            self._line("done", file, file_no)

    def _line(self, what: str, file: Path, file_no: int):
        unit, scale = ("GB", 1e9) if self.total >= 1e9 else ("MB", 1e6)
        print(f"convert: [{file_no}/{self.n_files}] {file.name}: {what}, {self.done / scale:.2f}/"
              f"{self.total / scale:.2f} {unit}, {time.perf_counter() - self.t0:.1f}s", file=self.stream, flush=True)


def load_target(model_dir: str | Path, *, dtype: str | None = None, sharding: ShardingSpec = None,
                progress: bool | None = None, mesh=None) -> Qwen35:
    """The Flax target from a HF checkpoint dir (Qwen3_5ForCausalLM or ForConditionalGeneration).

    dtype: parameter dtype (default: config.json's). sharding: a Sharding for every parameter or a
    function (param path, shape) -> Sharding. mesh: instead of `sharding`, tensor/data parallel on a
    (data, model) mesh (jaxspec/sharding.py): each device reads only its own shard of every tensor
    from the files (`get_slice`), in the tp layout. progress: lines on stderr (default: for
    checkpoints over 1 GB). `model.visual.*` and `mtp.*` tensors are not loaded (see `load_mtp_tensors`).
    """
    model_dir = Path(model_dir)
    infos = scan(model_dir)
    config_path = model_dir / "config.json"
    refuse_quantized(config_path, infos)
    cfg = load_target_config(model_dir, dtype=dtype)
    text = text_tensors(infos)
    check_against_config(cfg, text, config_path, model_dir)

    layout = target_layout(cfg)
    graphdef, flat = abstract_params(cfg)
    abstract = {path: var.get_value() for path, var in flat}
    if mesh is not None:
        from jaxspec import sharding as S
        if sharding is not None:
            raise ValueError("pass either sharding= or mesh=, not both")
        tp = S.tp_degree(mesh)
        S.check_target(cfg, tp)
        graphdef, flat = abstract_params(S.tp_config(cfg, tp))
        abstract = {path: var.get_value() for path, var in flat}
    model_cfg = S.tp_config(cfg, tp) if mesh is not None else cfg
    fused_abstract, abstract = abstract, split_params(model_cfg, abstract)    # read in the checkpoint's layout
    table = {entry[0] for entry in layout.values()}
    if table != set(abstract):  # model.py and keys.py disagree: a bug in jaxspec, not in the checkpoint
        raise RuntimeError(f"convert/keys.py and jaxspec/model.py disagree: model params without a checkpoint "
                           f"key {sorted(set(abstract) - table)[:5]}, table paths not in the model "
                           f"{sorted(table - set(abstract))[:5]}")

    files = sorted({text[n].file for n in text})
    todo = sorted(text.values(), key=lambda i: (files.index(i.file), i.key))
    total = sum(i.nbytes for i in todo)
    prog = Progress(total, len(files), total > 2**30 if progress is None else progress)
    values: dict[tuple, jax.Array] = {}
    name_of = {info.key: name for name, info in text.items()}
    handles: dict = {}
    try:
        for n, info in enumerate(todo):
            name = name_of[info.key]
            path, _, kind = layout[name]
            want = abstract[path]
            if mesh is not None:
                values[path] = _read_sharded(info, handles, kind, want, mesh, path, cfg)
                prog.tensor(info, files.index(info.file) + 1)
                if n + 1 == len(todo) or todo[n + 1].file != info.file:
                    prog.file_done(info.file, files.index(info.file) + 1)
                    _close(handles)
                continue
            host = _read(info, handles)
            out = _converter(kind, want.dtype, resolve_sharding(sharding, path, want.shape))(host)
            if out.shape != want.shape:
                raise RuntimeError(f"convert/keys.py maps {info.key!r} to shape {out.shape}, but the model's "
                                   f"{'.'.join(map(str, path))} is {want.shape}")
            # Block so that the host copy is released before the next tensor is read.
            values[path] = out.block_until_ready()
            del host
            prog.tensor(info, files.index(info.file) + 1)
            if n + 1 == len(todo) or todo[n + 1].file != info.file:
                prog.file_done(info.file, files.index(info.file) + 1)
                _close(handles)
    finally:
        _close(handles)
    if mesh is not None:
        place = lambda path, shape: jax.sharding.NamedSharding(mesh, S.param_spec(path, len(shape)))
    else:
        place = lambda path, shape: resolve_sharding(sharding, path, shape)
    values = fuse_params(model_cfg, values, sharding=place)
    for path, want in fused_abstract.items():
        if values[path].shape != want.shape:
            raise RuntimeError(f"fusing the checkpoint's kernels gave {'.'.join(map(str, path))} the shape "
                               f"{values[path].shape}, but the model's is {want.shape}")
    return assemble(graphdef, flat, values)


def _sources(kind, hf_shape, tp_map):
    """Per axis of the model's (tp) layout: the HF axis it reads and the HF index at each position (-1:
    zero padding); and the transposition from HF order."""
    base, groups = (kind[0], kind[1:]) if isinstance(kind, tuple) else (kind, ())
    axes = {"linear": (1, 0), "conv": (2, 0)}.get(base, tuple(range(len(hf_shape))))
    src = [np.arange(hf_shape[a]) for a in axes]
    if groups:
        from convert.keys import gdn_channel_order
        src[1] = gdn_channel_order(*groups)
    if tp_map is not None:
        ax, idx = tp_map
        src[ax] = np.where(idx >= 0, src[ax][np.maximum(idx, 0)], -1)
    return axes, src


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """Sorted unique values as [start, stop) runs of consecutive integers."""
    if not len(values):
        return []
    cut = np.flatnonzero(np.diff(values) != 1) + 1
    return [(int(r[0]), int(r[-1]) + 1) for r in np.split(values, cut)]


def _read_block(sl, hf_shape, axes, src, index, dtype) -> np.ndarray:
    """The block of the model layout at `index` (slices per model axis), read from the safetensors slice
    `sl` one contiguous run at a time: only this block's rows are read."""
    sel = [s[i] for s, i in zip(src, index)]
    hf_index: list = [slice(0, n) for n in hf_shape]
    fancy = None
    for k, a in enumerate(sel):
        if len(a) and (a >= 0).all() and (np.diff(a) == 1).all():
            hf_index[axes[k]] = slice(int(a[0]), int(a[-1]) + 1)
        else:
            fancy = k  # at most one axis is rearranged (GDN groups, repeated kv heads or padding)
    if fancy is None:
        block = sl[tuple(hf_index)]
    else:
        a, ax = sel[fancy], axes[fancy]
        valid = np.unique(a[a >= 0])
        parts = []
        for r0, r1 in _runs(valid):
            hf_index[ax] = slice(r0, r1)
            parts.append(sl[tuple(hf_index)])
        if parts:
            got = np.concatenate(parts, axis=ax)
        else:
            shape = [i.stop - i.start for i in hf_index]
            shape[ax] = 1
            got = np.zeros(shape, dtype)
        block = np.take(got, np.minimum(np.searchsorted(valid, np.maximum(a, 0)), max(len(valid) - 1, 0)), axis=ax)
        if (a < 0).any():
            shape = [1] * block.ndim
            shape[ax] = len(a)
            block = np.where((a >= 0).reshape(shape), block, np.zeros((), block.dtype))
    if len(hf_shape) == 3:  # conv [C, 1, K]
        block = block[:, 0, :]
    if len(axes) == 2 and axes[0] != 0:
        block = block.T
    return np.ascontiguousarray(block).astype(dtype)


def _read_sharded(info: TensorInfo, handles: dict, kind, want, mesh, path, cfg) -> jax.Array:
    """One parameter in its tp layout and NamedSharding, each addressable device's block read alone."""
    from jaxspec import sharding as S
    sf = handles.get(info.file)
    if sf is None:
        sf = handles[info.file] = _open(info.file).__enter__()
    sl = sf.get_slice(info.key)
    axes, src = _sources(kind, info.shape, S.tp_index(path, cfg, S.tp_degree(mesh)))
    dtype = np.dtype(want.dtype)
    cache: dict = {}

    def block(index):
        index = tuple(np.arange(n)[i] for n, i in zip(want.shape, index))
        key = tuple((int(i[0]), len(i)) if len(i) else (0, 0) for i in index)
        if key not in cache:
            try:
                cache[key] = _read_block(sl, info.shape, axes, src, index, dtype)
            except SafetensorError as e:
                raise CheckpointError(f"{info.file}: cannot read tensor {info.key!r} ({e})") from None
        return cache[key]

    sharding = jax.sharding.NamedSharding(mesh, S.param_spec(path, len(want.shape)))
    return jax.make_array_from_callback(tuple(want.shape), sharding, block)


MTP_FILE = "mtp.safetensors"


def _mtp_infos(model_dir: Path) -> dict[str, TensorInfo]:
    if (model_dir / "params").is_dir():  # a converted dir keeps them in one file of its own
        file = model_dir / MTP_FILE
        infos = scan_file(file) if file.exists() else {}
    else:
        infos = scan(model_dir)
    return {k: v for k, v in infos.items() if k.startswith(MTP_PREFIX)}


def has_mtp_tensors(model_dir: str | Path) -> bool:
    return bool(_mtp_infos(Path(model_dir)))


def mtp_tensor_infos(model_dir: str | Path) -> dict[str, TensorInfo]:
    """The `mtp.*` tensors' headers (file, shape, dtype), read without their data; a quantized head is refused.

    Works on a HF checkpoint dir and on a converted dir (which keeps them in `mtp.safetensors`)."""
    model_dir = Path(model_dir)
    mtp = _mtp_infos(model_dir)
    if not mtp:
        raise CheckpointError(f"{model_dir}: no {MTP_PREFIX}* (multi-token prediction) tensors in this "
                              f"checkpoint (Qwen3_5ForCausalLM saves drop them; the original multimodal "
                              f"checkpoint has them)")
    refuse_quantized(model_dir / "config.json", mtp)
    return dict(sorted(mtp.items()))


def read_tensors(infos: dict[str, TensorInfo]):
    """(key, array as stored) for each of `infos`, read one at a time from its file."""
    handles: dict = {}
    try:
        for k, info in infos.items():
            yield k, _read(info, handles)
    finally:
        _close(handles)


def load_mtp_tensors(model_dir: str | Path) -> dict[str, np.ndarray]:
    """The raw `mtp.*` tensors (multi-token-prediction head), keys and dtypes as stored, on the host."""
    return dict(read_tensors(mtp_tensor_infos(model_dir)))


def scan_file(file: Path) -> dict[str, TensorInfo]:
    with _open(file) as sf:
        return {k: TensorInfo(k, file, tuple(int(s) for s in sf.get_slice(k).get_shape()),
                              str(sf.get_slice(k).get_dtype())) for k in sf.keys()}
