"""Hugging Face transformers engine (``--engine hf --model PATH``), CPU or GPU.

Concurrent ``generate`` calls (the rollouts of a GRPO group, all groups of a
step) are gathered into batches: a worker task collects the requests waiting
at that moment, left-pads them and runs one ``model.generate`` in a thread,
so the event loop keeps running tools meanwhile. Logprobs are the chosen
tokens' log-probabilities under the model's raw logits (before temperature
and top-p), as vLLM reports them by default.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from rollout.engines import Generation, SamplingParams
from tracer.extras import install_command


class HFEngine:
    """transformers ``generate`` behind the engine interface.

    Args:
        model: A local model folder, or a loaded ``PreTrainedModel``.
        tokenizer: The model's tokenizer (its end-of-turn/eos tokens stop
            generation); default: loaded from ``model``.
        gguf_file: Load this GGUF file inside the ``model`` folder.
        device: ``"cpu"`` or e.g. ``"cuda"``.
        dtype: torch dtype name for loading (default: the checkpoint's).
        max_batch_size: Most sequences in one ``generate``.
        batch_wait_s: How long the worker waits for more requests before a batch.
        stop_token_ids: Extra ids that end a turn.
    """

    name = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        gguf_file: str | None = None,
        device: str = "cpu",
        dtype: str | None = None,
        max_batch_size: int = 16,
        batch_wait_s: float = 0.02,
        stop_token_ids: list[int] | None = None,
    ):
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ImportError(f"--engine hf needs {exc.name}: {install_command('hf')}") from exc
        self._torch = torch
        extra: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
        if isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            if not os.path.exists(path):
                raise FileNotFoundError(f"model folder {path!r} does not exist; the hf engine loads local folders only")
            kwargs: dict[str, Any] = {"local_files_only": True, **extra}
            if dtype:
                kwargs["dtype"] = getattr(torch, dtype)
            self.model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
            self.model_path: str | None = path
        else:
            self.model = model
            self.model_path = getattr(getattr(model, "config", None), "_name_or_path", None)
        self.model.to(device)
        self.model.eval()
        self.device = device
        if tokenizer is None:
            if self.model_path is None:
                raise ValueError("HFEngine needs tokenizer= when model is an object")
            tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True, **extra)
        self.tokenizer = tokenizer
        self.stop_token_ids = self._stop_ids(stop_token_ids)
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.stop_token_ids[0]
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self._queue: list[tuple[list[int], SamplingParams, asyncio.Future[Generation]]] = []
        self._worker: asyncio.Task[None] | None = None
        self.batches_run = 0

    def _stop_ids(self, extra: list[int] | None) -> list[int]:
        tok = self.tokenizer
        ids: list[int] = list(extra or [])
        for text in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", getattr(tok, "eos_token", None)):
            if not text:
                continue
            tid = tok.convert_tokens_to_ids(text)
            if isinstance(tid, int) and tid >= 0 and tid != tok.unk_token_id and tid not in ids:
                ids.append(tid)
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        for tid in eos if isinstance(eos, list) else [eos]:
            if isinstance(tid, int) and tid not in ids:
                ids.append(tid)
        if not ids:
            raise ValueError(
                "cannot tell which token ends a turn: the tokenizer has no eos token; pass stop_token_ids="
            )
        return ids

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Queue one request; it runs in the next batch."""
        fut: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._queue.append((list(prompt_ids), sampling, fut))
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not asyncio.get_running_loop():
            self._worker = asyncio.get_running_loop().create_task(self._work())
        return await fut

    async def _work(self) -> None:
        while self._queue:
            await asyncio.sleep(self.batch_wait_s)
            first = self._queue[0][1]
            key = (first.temperature, first.top_p)
            batch = [r for r in self._queue if (r[1].temperature, r[1].top_p) == key][: self.max_batch_size]
            for r in batch:
                self._queue.remove(r)
            live = [r for r in batch if not r[2].done()]
            if not live:
                continue
            try:
                outs = await asyncio.to_thread(self._generate_batch, [r[0] for r in live], [r[1] for r in live])
            except Exception as exc:
                for r in live:
                    if not r[2].done():
                        r[2].set_exception(exc)
                continue
            for r, out in zip(live, outs, strict=True):
                if not r[2].done():
                    r[2].set_result(out)

    def _generate_batch(self, prompts: list[list[int]], samplings: list[SamplingParams]) -> list[Generation]:
        torch = self._torch
        s = samplings[0]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        max_new = max(x.max_new_tokens for x in samplings)
        if s.seed is not None:
            torch.manual_seed(s.seed)
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new,
            "eos_token_id": self.stop_token_ids,
            "pad_token_id": self.pad_token_id,
            "return_dict_in_generate": True,
            "output_logits": any(x.logprobs for x in samplings),
        }
        if s.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=0)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device), **kwargs
            )
        new = out.sequences[:, width:].cpu()
        logprobs = None
        if out.logits is not None:
            logits = torch.stack(out.logits, dim=1).float().cpu()  # (batch, steps, vocab)
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        self.batches_run += 1
        stops = set(self.stop_token_ids)
        results = []
        for i, sampling in enumerate(samplings):
            ids = new[i].tolist()
            cut, finish = len(ids), "length"
            for j, tid in enumerate(ids):
                if tid in stops:
                    cut, finish = j + 1, "stop"
                    break
            if cut > sampling.max_new_tokens:
                cut, finish = sampling.max_new_tokens, "length"
            lp = [float(x) for x in logprobs[i, :cut].tolist()] if logprobs is not None and sampling.logprobs else None
            results.append(Generation(ids[:cut], lp, finish))
        return results

    async def close(self) -> None:
        """Stop the batching worker; the model is freed with the engine."""
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, Exception):
                pass
        self._worker = None
