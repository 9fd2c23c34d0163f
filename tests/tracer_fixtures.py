"""Helpers for tracer tests: a real Hugging Face tokenizer built locally."""

from __future__ import annotations

import functools
import os
import tempfile

CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? The answer is 72.",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "48 + 24"}}</tool_call>',
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
] * 20


@functools.lru_cache(maxsize=1)
def tokenizer_dir() -> str:
    """Train a small byte-level BPE and save it as a transformers fast tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    path = os.path.join(tempfile.mkdtemp(prefix="rt-tok-"), "tokenizer")
    fast.save_pretrained(path)
    return path


def hf_tokenizer():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir(), local_files_only=True)
