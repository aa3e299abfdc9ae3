"""Shared fixtures: tiny random Qwen3.5 checkpoints written by transformers in the real layouts."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ["JAX_PLATFORMS"] == "cpu":
    # The tests' programs are tiny and compiled once each: XLA's CPU backend compiling them without its expensive
    # optimisations runs the suite ~25-30% faster on a 2-core CPU. Set before any backend starts; the
    # subprocesses the CLI tests start inherit it. GPU runs (-m gpu, JAX_PLATFORMS=cuda) keep XLA's defaults.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
                               " --xla_llvm_disable_expensive_passes=true").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# Most of a CPU test's time is XLA compiling the engine's programs, and many tests (and both xdist workers) build
# the same programs for the same tiny models: a persistent compilation cache shared by all of them compiles each
# once (a fresh Engine on the tiny model: 28.8 s -> 3.6 s). The key is the whole program plus JAX's version and
# flags, so a stale entry is never used for a changed program. PYTEST_JAX_CACHE_DIR=off disables it.
_cache = os.environ.get("PYTEST_JAX_CACHE_DIR",
                        os.path.join(tempfile.gettempdir(), f"jaxspec-tests-jax-cache-{os.getuid()}"))
if _cache != "off":
    jax.config.update("jax_compilation_cache_dir", _cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
# `python -m jaxspec.generate` (in process and in the CLI tests' subprocesses) keeps to the tests' cache, or to
# none, rather than its default under ~/.cache (an empty value: no cache).
os.environ["JAX_COMPILATION_CACHE_DIR"] = "" if _cache == "off" else _cache
# 8 simulated CPU devices for the tensor/data-parallel tests (tests/test_sharding.py); everything else
# runs on the first one, as with a single device. Must precede the backend's initialisation.
jax.config.update("jax_num_cpu_devices", 8)

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
            linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=4, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_interleaved": True, "mrope_section": [11, 11, 10]})


def text_config(**overrides):
    from transformers import Qwen3_5TextConfig
    kw = {**TINY, **overrides}
    return Qwen3_5TextConfig(**kw)


def randomize_(model, seed=0, scale=0.3):
    """Move the zero/one-initialised norms, A_log and dt_bias off their defaults so that a wrong
    (1 + w) convention or a dropped bias shows up in the logits."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "A_log" in name or "dt_bias" in name:
                p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def make_causal_lm(path, seed=0, max_shard_size=None, **overrides):
    """Qwen3_5ForCausalLM (flat `model.*` keys) saved to `path`; returns the fp32 torch model."""
    import torch
    from transformers import Qwen3_5ForCausalLM
    torch.manual_seed(seed)
    model = randomize_(Qwen3_5ForCausalLM(text_config(**overrides)).float().eval(), seed)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kw)
    return model


def make_conditional(path, seed=0, max_shard_size=None, **overrides):
    """Qwen3_5ForConditionalGeneration (multimodal `model.language_model.*` + `model.visual.*`)."""
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    torch.manual_seed(seed)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=overrides.get(
        "hidden_size", TINY["hidden_size"]), patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
        num_position_embeddings=16)
    cfg = Qwen3_5Config(text_config=text_config(**overrides).to_dict(), vision_config=vision,
                        tie_word_embeddings=False)
    model = randomize_(Qwen3_5ForConditionalGeneration(cfg).float().eval(), seed)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kw)
    return model


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """(path, torch model) of the default tiny Qwen3_5ForCausalLM."""
    path = tmp_path_factory.mktemp("tiny_causal")
    return path, make_causal_lm(path)


def jitted(model):
    """model(tokens, state, tree, taps=...) and commit(...) compiled, so tests do not dispatch op by op."""
    import functools

    from flax import nnx

    from jaxspec.model import commit

    graphdef, params = nnx.split(model)

    @functools.partial(jax.jit, static_argnames=("taps",))
    def fwd(params, tokens, state, tree, taps=()):
        return nnx.merge(graphdef, params)(tokens, state, tree, taps=taps)

    com = jax.jit(commit)
    return (lambda tokens, state, tree, taps=(): fwd(params, tokens, state, tree, taps=taps)), com


@pytest.fixture
def seed(request):
    """A different seed per test (inputs are fresh per test, never zeros), reproducible from the test id."""
    import zlib
    return zlib.crc32(request.node.nodeid.encode()) % (1 << 31)
