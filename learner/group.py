"""LearnerGroup: the DeepSpeed ranks as Ray actors, fed whole GRPO groups from the ingest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from horizonrl.learner.batch import (
    pad_batch,
    positive_turns_only,
    shard_episodes,
    split_rows,
    turn_rows,
)
from horizonrl.learner.config import LearnerConfig, rank_bundle
from horizonrl.learner.credit import Estimator, groups_with_signal, make_estimator
from horizonrl.learner.worker import LearnerWorker
from horizonrl.protos.precision import emulated_bf16_warning
from horizonrl.protos.trajectory import Trajectory

__all__ = ["LearnerGroup", "PlacementTimeout", "advantage_stats", "combine_ranks",
           "groups_with_signal"]


# Per-rank figures that are not means over the rank's loss units: averaged over ranks as-is.
_RANK_FIGURES = frozenset({"learn_seconds", "micro_batches", "grad_norm", "lr"})


def combine_ranks(results: Sequence[dict[str, float]]) -> dict[str, float]:
    """The ranks' `train` metrics as one step's: `_max` keys the largest, the objectives'
    means weighted by each rank's loss units (tokens or episode shares), so the reported loss
    is the step's global mean whatever rows each rank drew; the rest averaged over ranks."""
    units = np.array([r.get("loss_units", 1.0) for r in results], dtype=np.float64)
    weights = units / units.sum() if units.sum() > 0 else np.full(len(units), 1 / len(units))
    out = {}
    for k in results[0]:
        per_rank = np.array([r[k] for r in results], dtype=np.float64)
        if k == "loss_units":
            continue
        if k.endswith("_max"):
            out[k] = float(per_rank.max())
        elif k in _RANK_FIGURES:
            out[k] = float(per_rank.mean())
        else:
            out[k] = float(weights @ per_rank)
    return out


def advantage_stats(advantages: np.ndarray, loss_mask: np.ndarray) -> dict[str, float]:
    """Mean, mean absolute value and standard deviation of the advantages on trained tokens
    (those with loss_mask > 0); empty when no token is trained."""
    a = advantages[loss_mask > 0]
    if a.size == 0:
        return {}
    return {"adv_mean": float(a.mean()), "adv_abs_mean": float(np.abs(a).mean()),
            "adv_std": float(a.std())}


class PlacementTimeout(RuntimeError):
    """Ray could not reserve the learner's bundles in time: the cluster lacks the room (the
    CLI exits 2, as for any run that does not fit)."""


def placement_group_or_explain(bundles: list[dict[str, float]], *, what: str,
                               timeout_s: float = 120.0, strategy: str = "PACK") -> Any:
    """Reserve `bundles`; on timeout raise an error saying what was asked and what is free."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group(bundles, strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise PlacementTimeout(f"could not place {what}: asked for {bundles}, cluster has "
                           f"{ray.available_resources()} free") from None
    return pg


def agreed_precision(per_rank: Sequence[str]) -> str:
    """The one dtype all ranks resolved `learner.dtype` to; ranks that would mix precisions
    (`auto` on nodes with and without bf16) are refused before their process group forms."""
    if len(set(per_rank)) != 1:
        raise ValueError(f"learner.dtype resolved to {list(per_rank)} across ranks (`auto` on "
                         "nodes with and without native bf16): set learner.dtype to float32 or "
                         "bfloat16")
    return per_rank[0]


class LearnerGroup:
    """`world_size` LearnerWorker actors on one placement group."""

    def __init__(self, cfg: LearnerConfig, *, model_path: str, pad_id: int, seed: int,
                 ref_model_path: str | None = None, temperature: float = 1.0) -> None:
        """`temperature`: the generators' sampling temperature, which the ranks divide logits
        by so that their logprobs and the behaviour logprobs are of the same distribution."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.cfg, self.pad_id = cfg, pad_id
        self.pg = placement_group_or_explain([rank_bundle(cfg)] * cfg.world_size,
                                             what="learner ranks", strategy=cfg.placement_strategy)
        remote = ray.remote(num_cpus=cfg.num_cpus_per_worker, num_gpus=cfg.num_gpus_per_worker,
                            resources=cfg.resources_per_worker or None,
                            max_restarts=0)(LearnerWorker)
        self.workers = [
            remote.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=rank)).remote(
                rank=rank, world_size=cfg.world_size, cfg=cfg, model_path=model_path,
                seed=seed, ref_model_path=ref_model_path, temperature=temperature)
            for rank in range(cfg.world_size)
        ]
        self.dtype = agreed_precision(ray.get([w.precision.remote() for w in self.workers]))
        if warning := emulated_bf16_warning("learner.dtype", [
                d for d in ray.get([w.emulated_bf16.remote() for w in self.workers]) if d]):
            print(warning, flush=True)
        # Rank 0's node, not 127.0.0.1: ranks may sit on different nodes of a real cluster.
        addr, port = ray.get(self.workers[0].rendezvous_address.remote())
        ray.get([w.setup.remote(addr, port) for w in self.workers])

    @property
    def estimator(self) -> Estimator:
        """The advantage estimator `learner.algorithm` names (learner.credit): it owns the
        advantages, which episodes an update keeps and what the ledger records of the rest."""
        return make_estimator(self.cfg)

    def fates(self, trajs: Sequence[Trajectory]) -> dict[str, list[int]]:
        """What `train(trajs)` does with each episode: "trained", or the reason it is not
        ("env_error", "timeout", "generator_lost" for infrastructure failures, "overlong",
        "zero_variance", "not_selected", "update_skipped"). Indices into `trajs`; for the run's
        ledger."""
        return self.estimator.fates(trajs)

    def train(self, trajs: Sequence[Trajectory]) -> dict[str, float]:
        """One policy update on whole groups; an update with too few episodes is skipped."""
        import ray

        if self.cfg.algorithm == "rejection_sampling":
            return self._rejection_sampling(trajs)
        est = self.estimator
        credit = est.assign(trajs)
        kept = [trajs[i] for i in credit.keep]
        if self.cfg.mask_invalid_turns:  # positive updates skip the rejected commands
            kept = [positive_turns_only(t, a, ta)
                    for t, a, ta in zip(kept, credit.advantages, credit.turn_advantages)]
        rows = sum(t.rows for t in kept)  # one per episode, or per turn in window mode
        stats = {"groups_kept": float(len({t.group_id for t in kept})),
                 "episodes_trained": float(len(kept)), "rows_trained": float(rows),
                 "skipped_update": 0.0, **credit.stats}
        if len(kept) < est.min_episodes():
            stats["skipped_update"] = 1.0
            return stats
        batch = pad_batch(kept, credit.advantages, pad_id=self.pad_id)
        token_level = est.token_advantages(kept, batch)
        if token_level is not None:
            batch["advantages"] = token_level
        stats.update(advantage_stats(batch["advantages"], batch["loss_mask"]))
        if any(t.turn_spans for t in kept):
            # Advantages above are per episode (or per token of the whole episode); each
            # turn's row takes its tokens' share of them.
            batch = turn_rows(kept, batch, pad_id=self.pad_id)
        stats["tokens_trained"] = float(batch["loss_mask"].sum())
        shards = shard_episodes(batch, [t.rows for t in kept], ranks=self.cfg.world_size,
                                minibatches=self.cfg.minibatches,
                                token_mean=self.cfg.loss_agg == "token-mean",
                                balance=self.cfg.layout != "padded")
        results = ray.get([w.train.remote(s) for w, s in zip(self.workers, shards)])
        stats.update(combine_ranks(results))
        return stats

    def _rejection_sampling(self, trajs: Sequence[Trajectory]) -> dict[str, float]:
        """Rejection-sampling fine-tuning: SFT on this batch's successful episodes (distinct
        responses per group); skipped when fewer than one per rank succeeded."""
        from horizonrl.learner.auxiliary import rejection_sampling_examples

        examples = rejection_sampling_examples(
            trajs, mask_invalid_turns=self.cfg.mask_invalid_turns)
        stats = {"rows_trained": float(len(examples)), "skipped_update": 0.0}
        if len(examples) < self.estimator.min_episodes():
            return {**stats, "skipped_update": 1.0}
        sft = self.train_sft(examples)
        return {**stats, **sft, "loss": sft["sft_loss"]}

    def importance_weights(self, trajs: Sequence[Trajectory]) -> dict[str, np.ndarray]:
        """The decoupled loss's inputs for `trajs` as `train` would compute them now (padded
        batch order): loss_mask, behaviour logprobs, pre-update logprobs, truncated weights."""
        import ray

        batch = pad_batch(trajs, np.zeros(len(trajs)), pad_id=self.pad_id)
        shards = split_rows(batch, self.cfg.world_size)
        parts = ray.get([w.importance_weights.remote(s) for w, s in zip(self.workers, shards)])
        out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}  # shards keep the width
        return {"loss_mask": batch["loss_mask"], "old_logprobs": batch["old_logprobs"], **out}

    def train_sft(self, examples: Sequence[Any]) -> dict[str, float]:
        """One SFT step on `examples` (learner.auxiliary.SFTExample), rows split over ranks."""
        from horizonrl.learner.auxiliary import pad_examples

        return self._aux("sft", pad_examples(examples, self.pad_id))

    def train_dpo(self, pairs: Sequence[Any]) -> dict[str, float]:
        """One DPO step on chosen/rejected pairs (learner.auxiliary.DPOPair)."""
        from horizonrl.learner.auxiliary import pad_examples

        batch = {}
        for side in ("chosen", "rejected"):
            arrays = pad_examples([getattr(p, f"{side}_example")() for p in pairs], self.pad_id)
            batch.update({f"{side}_{k}": v for k, v in arrays.items()})
        return self._aux("dpo", batch)

    def _aux(self, kind: str, batch: dict[str, np.ndarray]) -> dict[str, float]:
        import ray

        if len(next(iter(batch.values()))) < self.cfg.world_size:
            raise ValueError(f"{kind}: a step needs at least {self.cfg.world_size} rows "
                             "(one per rank)")
        shards = split_rows(batch, self.cfg.world_size)
        results = ray.get([w.train_aux.remote(kind, s) for w, s in zip(self.workers, shards)])
        return {k: float(np.mean([r[k] for r in results])) for k in results[0]}

    def save_checkpoint(self, path: Any) -> None:
        """Every rank writes its optimizer/model partition and RNG state under `path`."""
        import ray

        ray.get([w.save_checkpoint.remote(str(path)) for w in self.workers])

    def load_checkpoint(self, path: Any) -> None:
        import ray

        ray.get([w.load_checkpoint.remote(str(path)) for w in self.workers])

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        import ray

        return ray.get([w.score.remote(sequences) for w in self.workers])[0]

    def state_dict_ref(self) -> Any:
        """An ObjectRef to rank 0's full state dict (generators resolve it themselves)."""
        import ray

        refs = [w.state_dict.remote() for w in self.workers]
        ray.get(refs[1:])  # the other ranks return None once the (ZeRO-3) gather is done
        return refs[0]

    def save_hf(self, path: Any) -> None:
        import ray

        ray.get([w.save_hf.remote(str(path)) for w in self.workers])

    def dead_ranks(self, timeout_s: float = 10.0) -> list[int]:
        """Ranks whose actor no longer answers a `ready` ping."""
        import ray

        dead = []
        for rank, w in enumerate(self.workers):
            try:
                ray.get(w.ready.remote(), timeout=timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                dead.append(rank)
        return dead

    def health(self) -> list[dict[str, Any]]:
        import ray

        return ray.get([w.health.remote() for w in self.workers])

    def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.pg)

    # -- broadcast weight sync (see learner.weights.BroadcastWeightSync) ----------------------
    def weight_specs(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, dtype) of every tensor rank 0 sends in a push (a ZeRO-3 gather)."""
        import ray

        return ray.get([w.weight_specs.remote() for w in self.workers])[0]

    def weight_device(self) -> str | None:
        """Rank 0's GPU UUID (None on CPU)."""
        import ray

        return ray.get(self.workers[0].weight_device.remote())

    def weight_group_address(self) -> tuple[str, int]:
        """Rank 0's node IP and a free port there: rank 0 hosts the weight group's rendezvous."""
        import ray

        return ray.get(self.workers[0].rendezvous_address.remote())

    def join_weight_group_ref(self, **kwargs: Any) -> Any:
        """Rank 0 joins the weight group (`LearnerWorker.join_weight_group` arguments). A ref:
        the join returns only once every receiver has joined too."""
        return self.workers[0].join_weight_group.remote(**kwargs)

    def broadcast_weights_refs(self, buckets: Sequence[Any]) -> list[Any]:
        """Every rank's part of one push, as refs: the receivers must be receiving meanwhile."""
        return [w.broadcast_weights.remote(buckets) for w in self.workers]

    def leave_weight_group_ref(self) -> Any:
        """Rank 0 leaves the broadcast group; an ObjectRef of the call."""
        return self.workers[0].leave_weight_group.remote()
