"""LearnerWorker: one DeepSpeed ZeRO rank holding the policy, a frozen reference model and,
for PPO, a critic engine.

Plain class, made remote at the edge by `LearnerGroup`. Ranks meet at rank 0's node IP (Ray's
view of it), over gloo on CPU and NCCL on GPUs.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from horizonrl.learner import algorithms as alg
from horizonrl.learner.batch import split_minibatches, trim
from horizonrl.learner.config import LearnerConfig
from horizonrl.learner.engine_setup import (
    compute_dtype,
    deepspeed_config,
    load_engines,
    local_gpu_ordinal,
    lr_factor,
    save_engines,
)
from horizonrl.learner.layout import rank_plan, token_logprobs_by_layout
from horizonrl.learner.objectives import (
    policy_loss,
    rollout_correction,
    turn_gae_targets,
    value_objective,
    whiten,
)
from horizonrl.learner.weight_source import WeightSource
from horizonrl.protos.placement import node_ip
from horizonrl.protos.precision import bf16_native, emulated_bf16, learner_dtype


class LearnerWorker(WeightSource):
    """One rank: forward/backward with DeepSpeed, the policy (and value) objectives,
    checkpoints; the weights for the generators come from `WeightSource`."""

    def __init__(self, *, rank: int, world_size: int, cfg: LearnerConfig, model_path: str,
                 seed: int, ref_model_path: str | None = None,
                 temperature: float = 1.0) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        # The generators' sampling temperature: RL logprobs are of logits / T, the distribution
        # the tokens were drawn from (the engine returns the same, processed logprobs).
        self.temperature = temperature
        self.model_path, self.ref_model_path, self.seed = model_path, ref_model_path, seed
        torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(seed)
        self.updates = 0

    def precision(self) -> str:
        """The dtype this rank computes in, "float32" or "bfloat16": `auto` is decided by the device
        it trains on (the group checks that all ranks agree before they meet)."""
        return learner_dtype(self.cfg.dtype, native_bf16=bf16_native(self._device()))

    def emulated_bf16(self) -> str | None:
        """This rank's device, where it computes in bf16 without native support (else None)."""
        return emulated_bf16(self.precision(), self._device())

    def _device(self) -> str:
        _, ordinal = self.assigned_gpu()
        return f"cuda:{ordinal}" if ordinal is not None and torch.cuda.is_available() else "cpu"

    def rendezvous_address(self) -> tuple[str, int]:
        """Where rank 0 listens for the process group: its node's IP and a free port there."""
        import socket

        ip = node_ip()
        with socket.socket() as s:
            s.bind((ip, 0))
            return ip, s.getsockname()[1]

    def assigned_gpu(self) -> tuple[list[str], int | None]:
        """(GPU ids Ray assigned this rank, the CUDA ordinal it trains on; None: CPU)."""
        import ray

        ids = [str(x) for x in ray.get_gpu_ids()] if ray.is_initialized() else []
        return ids, local_gpu_ordinal(ids, os.environ.get("CUDA_VISIBLE_DEVICES"))

    def setup(self, master_addr: str, master_port: int) -> bool:
        """Join the process group (gloo on CPU, NCCL on GPU), load models, build the engine."""
        _, ordinal = self.assigned_gpu()
        use_gpu = ordinal is not None and torch.cuda.is_available()
        if not use_gpu:
            os.environ["DS_ACCELERATOR"] = "cpu"  # say it rather than be warned
        else:
            torch.cuda.set_device(ordinal)
        # DeepSpeed places the engine on cuda:LOCAL_RANK: the ordinal Ray's assignment gives.
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size),
                          LOCAL_RANK=str(ordinal if use_gpu else 0), MASTER_ADDR=master_addr,
                          MASTER_PORT=str(master_port))
        import deepspeed
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        # DeepSpeed 0.19's ZeRO gathers call a torch API deprecated in 2.13, once per step.
        warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*",
                                category=FutureWarning)
        self.cfg = self.cfg.model_copy(update={"dtype": self.precision()})
        cfg = self.cfg
        if not cfg.shm_allreduce:
            # Skips the 1-2 min gcc build of the shm allreduce; DeepSpeed then uses gloo alone.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        backend = "nccl" if use_gpu else "gloo"
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        # Loaded in fp32 either way: in bf16 mode DeepSpeed casts the module and keeps fp32
        # master weights in the optimizer.
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        if cfg.gradient_checkpointing:
            model.config.use_cache = False
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        self.ref = None
        if cfg.kl_coef > 0:  # frozen: kept in the compute dtype only
            self.ref = AutoModelForCausalLM.from_pretrained(
                self.ref_model_path or self.model_path, dtype=compute_dtype(cfg))
            self.ref.eval().requires_grad_(False)
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=deepspeed_config(cfg, micro_batch=1, lr=cfg.lr), lr_scheduler=self._schedule)
        self.critic = None
        from horizonrl.learner.credit import estimator_class

        if estimator_class(cfg.algorithm).needs_critic:  # its own engine, optimizer and lr
            from horizonrl.learner.critic import ValueModel

            value_model = ValueModel(self.ref_model_path or self.model_path)
            self.critic, *_ = deepspeed.initialize(
                model=value_model, model_parameters=list(value_model.parameters()),
                config=deepspeed_config(cfg, micro_batch=1, lr=cfg.critic_lr),
                lr_scheduler=self._schedule)
        if self.ref is not None:
            self.ref.to(self.engine.device)
        return True

    def _schedule(self, optimizer: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, cfg=self.cfg))

    def ready(self) -> bool:
        return True

    def node_ip(self) -> str:
        return node_ip()

    def health(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "updates": self.updates}

    def train(self, shard: dict[str, np.ndarray]) -> dict[str, float]:
        """`epochs` x `minibatches` optimizer steps on this rank's shard (from
        `learner.batch.shard_episodes`); mean metrics."""
        t0 = time.perf_counter()
        self.engine.train()
        if self.critic is not None:
            shard = self._ppo_targets(shard)
        mismatch: dict[str, float] = {}
        if self.cfg.decoupled_loss or self.cfg.seq_mask_band:
            shard, mismatch = self._correction_inputs(shard)
        stats: dict[str, list[float]] = {}
        for _ in range(self.cfg.epochs):
            for mb in split_minibatches(shard, self.cfg.minibatches):
                for k, v in self._step(mb).items():
                    stats.setdefault(k, []).append(v)
        # Without a correction pass, the sampler-vs-learner gap is read off the first
        # optimizer step's forward, the only one still at the pre-update weights.
        out = {k: v[0] if k.startswith("mismatch_") else float(np.mean(v))
               for k, v in stats.items()}
        out.update(mismatch)
        out["loss_units"] = float(shard["loss_units"].sum())  # the group weighs ranks by it
        out["learn_seconds"] = time.perf_counter() - t0
        return out

    def _tensors(self, mb: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        # Arrays from Ray's object store are read-only; torch warns on every such view, and a
        # write through one would fault. np.require copies only those.
        return {k: torch.from_numpy(np.require(v, requirements="W")).to(self.engine.device)
                for k, v in mb.items()}

    def _plan(self, mb: dict[str, np.ndarray]) -> tuple[str, list[np.ndarray | None]]:
        """The layout and each micro-batch's rows (None: a zero-weight pass), as many on every
        rank (ZeRO-3 gathers and the boundary reduction are collective)."""
        import torch.distributed as dist

        def most(n: int) -> int:  # the largest count over the ranks
            x = torch.tensor([n])
            if dist.is_initialized() and self.world_size > 1:
                dist.all_reduce(x, op=dist.ReduceOp.MAX)
            return int(x.item())

        return rank_plan(mb, self.cfg.layout, self.cfg.micro_batch_tokens, agree=most,
                         checkpointing=self.cfg.gradient_checkpointing,
                         zero_stage=self.cfg.zero_stage)

    def _logprobs(self, model: Any, t: dict[str, torch.Tensor], layout: str, *,
                  entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        return token_logprobs_by_layout(model, t, layout=layout, temperature=self.temperature,
                                        entropy=entropy)

    def _step(self, mb: dict[str, np.ndarray]) -> dict[str, float]:
        """One optimizer step (policy, and critic for PPO) over micro-batches of `mb`."""
        layout, plan = self._plan(mb)
        # A micro-batch's loss is a mean over its own units (tokens or episode shares); times
        # its units over the whole step's, on every rank, it is its part of one global mean.
        # DeepSpeed averages the ranks' gradients, hence x world_size.
        scale = self.world_size / max(float(mb["step_units"][0]), 1e-9)
        local = float(mb["loss_units"].sum())  # the metrics stay this rank's means
        train_policy = self.critic is None or self.updates >= self.cfg.critic_warmup_steps
        stats: dict[str, float] = {}
        for i, rows in enumerate(plan):
            last = i == len(plan) - 1
            if rows is None:  # fewer rows than passes here: a zero-weight pass, 2 tokens long
                micro, units, how = {k: v[:1, :2] if v.ndim == 2 else v[:1]
                                     for k, v in mb.items()}, 0.0, "padded"
            else:
                micro = trim({k: v[rows] for k, v in mb.items()})
                units, how = float(micro["loss_units"].sum()), layout
            weight = units * scale
            t = self._tensors(micro)
            self.engine.set_gradient_accumulation_boundary(last)
            # Rows are right-padded and attention is causal, so padding never reaches a real
            # token: no attention mask, which keeps SDPA on its fast causal path.
            logp, ent = self._logprobs(self.engine, t, how)
            ref_logp = None
            if self.ref is not None:
                with torch.no_grad():
                    ref_logp = self._logprobs(self.ref, t, how, entropy=False)[0]
            loss, st = policy_loss(logp, ent, t, self.cfg, ref_logprobs=ref_logp)
            self.engine.backward(loss * (weight if train_policy else 0.0))
            st["loss"] = loss.detach()
            if self.critic is not None:
                self.critic.set_gradient_accumulation_boundary(last)
                vloss, vst = value_objective(self.critic(t["input_ids"]), t, self.cfg.value_clip)
                self.critic.backward(vloss * weight)
                st.update(vst)
            for k, v in st.items():
                if k.endswith("_max"):
                    stats[k] = max(stats.get(k, 0.0), float(v)) if units else stats.get(k, 0.0)
                else:
                    stats[k] = stats.get(k, 0.0) + float(v) * units / max(local, 1e-9)
        self.engine.step()
        if self.critic is not None:
            self.critic.step()
        self.updates += 1
        grad_norm = self.engine.get_global_grad_norm()
        stats.update(grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
                     lr=float(self.engine.get_lr()[0]), micro_batches=float(len(plan)))
        return stats

    def train_aux(self, kind: str, shard: dict[str, np.ndarray]) -> dict[str, float]:
        """One optimizer step of SFT (`kind="sft"`: input_ids, loss_mask) or DPO (`"dpo"`:
        chosen_* and rejected_* arrays, against the frozen reference) on this rank's shard."""
        from horizonrl.learner.auxiliary import auxiliary_loss

        self.engine.train()
        self.engine.set_gradient_accumulation_boundary(True)
        loss, stats = auxiliary_loss(kind, shard, self.engine, self.ref, self._tensors,
                                     dpo_beta=self.cfg.dpo_beta)
        self.engine.backward(loss)
        self.engine.step()
        self.updates += 1
        return stats

    @torch.no_grad()
    def _correction_inputs(self, shard: dict[str, np.ndarray],
                           ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """The learner's pre-update logprobs (`prox_logprobs`), the rollout correction's
        per-token weights (`is_weights`: TIS with the decoupled loss, sequence masking with
        seq_mask_band) and the mismatch statistics over the whole shard."""
        self.engine.eval()
        layout, plan = self._plan(shard)
        prox = np.zeros(shard["input_ids"].shape, dtype=np.float32)
        for rows in plan:
            if rows is None:  # fewer rows than passes here: a throwaway pass keeps ZeRO-3 in step
                self.engine(input_ids=self._tensors({"input_ids": shard["input_ids"][:1, :2]})[
                    "input_ids"])
                continue
            t = self._tensors(trim({k: v[rows] for k, v in shard.items()}))
            lp = self._logprobs(self.engine, t, layout, entropy=False)[0].cpu().numpy()
            prox[rows, :lp.shape[1]] = lp
        self.engine.train()
        out = dict(shard)
        out["prox_logprobs"] = (prox * shard["loss_mask"]).astype(np.float32)
        weights, stats = rollout_correction(
            # Copies: the shard's arrays are read-only views of Ray's object store.
            torch.tensor(out["prox_logprobs"]), torch.tensor(shard["old_logprobs"]),
            torch.tensor(shard["loss_mask"]), tis=bool(self.cfg.decoupled_loss),
            cap=self.cfg.is_cap, band=self.cfg.seq_mask_band)
        out["is_weights"] = weights.numpy().astype(np.float32)
        return out, {k: float(v) for k, v in stats.items()}

    def importance_weights(self, shard: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """What `train` would weight this shard's tokens by (for checks): prox logprobs and the
        rollout correction's weights."""
        out, _ = self._correction_inputs(shard)
        return {"prox_logprobs": out["prox_logprobs"], "is_weights": out["is_weights"]}

    @torch.no_grad()
    def _ppo_targets(self, shard: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Old values, GAE advantages (whitened over every rank's model tokens) and returns."""
        import torch.distributed as dist

        self.critic.eval()
        t = self._tensors(shard)
        mask, rewards = t["loss_mask"], t["token_rewards"].clone()
        old_values = self.critic(t["input_ids"]) * mask
        if self.cfg.kl_in_reward and self.ref is not None:
            ref_logp = self._logprobs(self.ref, t, "padded", entropy=False)[0]
            kl = alg.kl_penalty(t["old_logprobs"], ref_logp, "k1")
            rewards = rewards - self.cfg.kl_coef * kl * mask
        if "turn" in t:  # window rows: one value per turn, GAE across the episode's rows
            adv, returns = turn_gae_targets(rewards, old_values, mask, t["episode"], t["turn"],
                                            gamma=self.cfg.turn_gamma, lam=self.cfg.lam)
        else:
            adv, returns = alg.gae_advantages(rewards, old_values, mask, gamma=self.cfg.gamma,
                                              lam=self.cfg.lam)
        sums = torch.stack([(adv * mask).sum(), (adv.square() * mask).sum(), mask.sum()])
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(sums)
        self.critic.train()
        out = dict(shard)
        out["advantages"] = whiten(adv, mask, sums=sums).cpu().numpy()
        out["returns"] = returns.cpu().numpy()
        out["old_values"] = old_values.cpu().numpy()
        return out

    @torch.no_grad()
    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Logprob of every token of each sequence under the current policy at temperature 1
        (the model itself, like the engine's `score`: prompt logprobs ignore temperature)."""
        self.engine.eval()
        out = []
        for seq in sequences:
            ids = torch.tensor([list(seq)], dtype=torch.long, device=self.engine.device)
            out.append(alg.token_logprobs(self.engine(input_ids=ids).logits, ids)[0].tolist())
        return out

    def save_checkpoint(self, path: str) -> None:
        """Model, optimizer and scheduler (ZeRO-partitioned, every rank writes its part) and this
        rank's RNG states under `path`; every rank must call."""
        save_engines(path, {"policy": self.engine, "critic": self.critic}, rank=self.rank,
                     updates=self.updates)

    def load_checkpoint(self, path: str) -> None:
        """Restore what `save_checkpoint` wrote (same world size and ZeRO stage)."""
        self.updates = load_engines(path, {"policy": self.engine, "critic": self.critic},
                                    rank=self.rank)

    def save_hf(self, path: str) -> None:
        """Write a `save_pretrained` folder (rank 0; every rank must call, as above)."""
        sd = self.state_dict()
        if sd is not None:
            self.engine.module.save_pretrained(
                path, state_dict={k: torch.from_numpy(v) for k, v in sd.items()})
