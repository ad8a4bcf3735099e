"""A tiny Llama and its tokenizer, built locally in seconds: no download, no hub.

For tests, examples and benchmarks that need a real vLLM engine on a machine without network or
accelerator. The tokenizer is a byte-level BPE trained on generated sentences; the model is a
randomly initialised two-layer Llama (about 210k parameters) saved beside it in safetensors, so
vLLM loads the directory like any checkpoint.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

_WORDS = (
    "the a one every some actor mesh engine token prompt weight cache batch request pool "
    "model layer rank queue call step group session update pause resume abort wait keep "
    "fast slow small large first last next old new red blue green runs sends holds loads "
    "reads writes waits stops starts moves takes gives finds counts and or but then while"
).split()

VOCAB_SIZE = 1000
"""Size of the tokenizer's vocabulary and of the model's embedding."""


def _sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) + "."
            for _ in range(count)]


def build_tiny_llama(path: str | Path, *, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny Llama (config, safetensors weights, tokenizer) to `path`; return the path.

    Deterministic for a given `seed`: the same directory content every time. `dtype` is the
    checkpoint's ("float32" or "bfloat16"). An existing model at `path` is reused as is; a new
    one is written beside it and renamed into place, so a crash never leaves half a model.
    """
    return build_llama(path, seed=seed, dtype=dtype)


def build_llama(path: str | Path, *, hidden_size: int = 64, intermediate_size: int = 128,
                num_layers: int = 2, num_heads: int = 2, seed: int = 0,
                dtype: str = "float32") -> Path:
    """`build_tiny_llama` with the model's sizes given: the same tokenizer, a randomly
    initialised Llama of `num_layers` layers (e.g. hidden 1024, intermediate 2816, 8 layers,
    16 heads in bfloat16: about 200 MiB, for the weight-transfer benchmark)."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype={dtype!r}: must be 'float32' or 'bfloat16'")
    out = Path(path)
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_sentences(400, seed), vocab_size=VOCAB_SIZE, min_frequency=1,
                            show_progress=False, special_tokens=["<unk>", "<s>", "</s>"])
    fast_tokenizer: Any = PreTrainedTokenizerFast  # untyped for mypy
    tokenizer = fast_tokenizer(tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>",
                               eos_token="</s>")
    tokenizer.save_pretrained(work)

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_heads, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        llama: Any = LlamaForCausalLM  # untyped for mypy
        model = llama(config)
    model.to(getattr(torch, dtype)).save_pretrained(work, safe_serialization=True)
    try:
        os.replace(work, out)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        if not (out / "config.json").is_file():  # not another process that won the race
            raise
    return out
