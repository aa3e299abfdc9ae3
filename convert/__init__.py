"""Checkpoint converters: Hugging Face safetensors -> jaxspec Flax params -> Orbax."""
