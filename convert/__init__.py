"""Checkpoint converters: Hugging Face safetensors -> jaxspec Flax params -> Orbax.

`load_model(path)` is the one entry point for code that needs the target: it takes a HF checkpoint dir
or a dir written by `save_converted` / `python -m convert target`. `load_draft(path)` is the same for the
DFlash drafter (a HF drafter dir or one written by `save_drafter` / `python -m convert drafter`).
`load_mtp(path, target_cfg)` is the target checkpoint's own MTP head (`mtp.*`), from either kind of dir.
"""

import importlib

# Resolved on first use so that `python -m convert --help` does not import jax, flax and orbax.
_EXPORTS = {"CheckpointError": "convert.hf", "has_mtp_tensors": "convert.hf", "load_mtp_tensors": "convert.hf",
            "load_target": "convert.hf", "is_converted": "convert.store", "load_model": "convert.store",
            "restore_converted": "convert.store", "save_converted": "convert.store",
            "load_draft": "convert.drafter", "load_drafter": "convert.drafter", "restore_drafter": "convert.drafter",
            "save_drafter": "convert.drafter", "load_mtp": "convert.mtp"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'convert' has no attribute {name!r}")
