"""LearnerWorker: one DeepSpeed ZeRO rank holding the policy and a frozen reference model.

Plain class, made remote at the edge by `LearnerGroup`. Ranks meet over gloo on 127.0.0.1.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from learner import algorithms as alg
from learner.batch import split_rows, trim
from learner.config import LearnerConfig


def deepspeed_config(cfg: LearnerConfig, micro_batch: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.grad_clip,
        # torch's AdamW: DeepSpeed's CPUAdam/FusedAdam JIT-compile for ~4 min each.
        "optimizer": {"type": "AdamW", "params": {"lr": cfg.lr, "weight_decay": cfg.weight_decay,
                                                  "torch_adam": True}},
        "zero_optimization": {"stage": cfg.zero_stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class LearnerWorker:
    """One rank: forward/backward with DeepSpeed, GRPO loss, weights for the generators."""

    def __init__(self, *, rank: int, world_size: int, cfg: LearnerConfig, model_path: str,
                 seed: int, ref_model_path: str | None = None) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.model_path, self.ref_model_path, self.seed = model_path, ref_model_path, seed
        torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(seed)
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # say it rather than be warned
        self.updates = 0

    def rendezvous_address(self) -> tuple[str, int]:
        """Where rank 0 listens for the process group: its node's IP and a free port there."""
        import socket

        import ray

        ip = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        with socket.socket() as s:
            s.bind((ip, 0))
            return ip, s.getsockname()[1]

    def setup(self, master_addr: str, master_port: int) -> bool:
        """Join the process group (gloo on CPU, NCCL on GPU), load models, build the engine."""
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size),
                          LOCAL_RANK="0", MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        import deepspeed
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        # DeepSpeed 0.19's ZeRO gathers call a torch API deprecated in 2.13, once per step.
        warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*",
                                category=FutureWarning)
        cfg = self.cfg
        if not cfg.shm_allreduce:
            # Skips the 1-2 min gcc build of the shm allreduce; DeepSpeed then uses gloo alone.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        self.ref = None
        if cfg.kl_coef > 0:
            self.ref = AutoModelForCausalLM.from_pretrained(
                self.ref_model_path or self.model_path, dtype=torch.float32)
            self.ref.eval().requires_grad_(False)
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=deepspeed_config(cfg, micro_batch=1), lr_scheduler=self._schedule)
        if self.ref is not None:
            self.ref.to(self.engine.device)
        return True

    def _schedule(self, optimizer: torch.optim.Optimizer) -> Any:
        # Update k (0-based) uses lr * (k+1)/warmup: DeepSpeed's WarmupLR gives the first
        # update lr 0, which wastes it (and with no warm-up at all, every other one too).
        warmup = self.cfg.warmup_steps
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda k: min(1.0, (k + 1) / warmup) if warmup else 1.0)

    def ready(self) -> bool:
        return True

    def health(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "updates": self.updates}

    def train(self, shard: dict[str, np.ndarray]) -> dict[str, float]:
        """`epochs` x `minibatches` optimizer steps on this rank's shard; mean metrics."""
        t0 = time.perf_counter()
        self.engine.train()
        stats: dict[str, list[float]] = {}
        for _ in range(self.cfg.epochs):
            for mb in split_rows(shard, self.cfg.minibatches):
                for k, v in self._step(trim(mb)).items():
                    stats.setdefault(k, []).append(v)
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        out["learn_seconds"] = time.perf_counter() - t0
        return out

    def _step(self, mb: dict[str, np.ndarray]) -> dict[str, float]:
        t = {k: torch.from_numpy(v).to(self.engine.device) for k, v in mb.items()}
        # Rows are right-padded and attention is causal, so padding never reaches a real token:
        # no attention mask, which keeps SDPA on its fast causal path.
        logits = self.engine(input_ids=t["input_ids"]).logits
        logp = alg.token_logprobs(logits, t["input_ids"])
        mask = t["loss_mask"]
        pg, clip_frac, ratio = alg.clipped_policy_loss(
            logp, t["old_logprobs"], t["advantages"], mask, clip=self.cfg.clip_ratio)
        loss, kl = pg, torch.zeros(())
        if self.ref is not None:
            with torch.no_grad():
                ref_logits = self.ref(input_ids=t["input_ids"]).logits
            kl = alg.masked_mean(alg.kl_penalty(
                logp, alg.token_logprobs(ref_logits, t["input_ids"]), self.cfg.kl_estimator), mask)
            loss = pg + self.cfg.kl_coef * kl
        self.engine.backward(loss)
        self.engine.step()
        self.updates += 1
        with torch.no_grad():
            entropy = alg.masked_mean(alg.entropy_from_logits(logits.detach()), mask)
            dev = ((ratio.detach() - 1).abs() * mask).max()
        grad_norm = self.engine.get_global_grad_norm()
        return {"loss": loss.item(), "pg_loss": pg.item(), "kl": kl.item(),
                "clip_frac": clip_frac.item(), "entropy": entropy.item(),
                "ratio_max_dev": dev.item(),
                "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
                "lr": float(self.engine.get_lr()[0])}

    @torch.no_grad()
    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Logprob of every token of each sequence under the current policy."""
        self.engine.eval()
        out = []
        for seq in sequences:
            ids = torch.tensor([list(seq)], dtype=torch.long, device=self.engine.device)
            out.append(alg.token_logprobs(self.engine(input_ids=ids).logits, ids)[0].tolist())
        return out

    def state_dict(self) -> dict[str, np.ndarray] | None:
        """Full HF state dict on rank 0 (every rank must call: ZeRO-3 gathers collectively).

        Keeps `lm_head.weight` even when tied to the embeddings: vLLM leaves a tied head stale
        if it is missing from the reload.
        """
        import deepspeed

        module = self.engine.module
        params = list(module.parameters())
        with deepspeed.zero.GatheredParameters(params, enabled=self.cfg.zero_stage == 3):
            if self.rank != 0:
                return None
            sd = {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}
        if "lm_head.weight" not in sd and "model.embed_tokens.weight" in sd:
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"].copy()
        return sd

    def save_hf(self, path: str) -> None:
        """Write a `save_pretrained` folder (rank 0; every rank must call, as above)."""
        sd = self.state_dict()
        if sd is not None:
            self.engine.module.save_pretrained(
                path, state_dict={k: torch.from_numpy(v) for k, v in sd.items()})
