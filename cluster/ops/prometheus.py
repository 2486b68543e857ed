"""Prometheus metrics from the driver, and the reader behind `horizonrl status`.

Why prometheus-client in the driver rather than Ray's metrics API: every figure passes through
the driver once per iteration, the same code serves a laptop and the KubeRay pod that runs the
driver (one port to scrape, set by config), and no Ray agent is needed. Names are prefixed
`horizonrl_` and carry `run` and `env` labels.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from horizonrl.protos.trajectory import Failure, Trajectory

LABELS = ("run", "env")
# name -> (help, key in the driver's flattened metrics). A key absent from a step's metrics
# (or not a number) leaves its gauge alone: it keeps its last value, and a gauge never set
# has no series at all, so an estimator without a figure shows no line rather than a 0.
GAUGES = {
    "step": ("Training steps finished", "step_done"),
    "horizon": ("Interaction horizon in force (max turns)", "horizon"),
    "policy_version": ("Policy version held by the generators", "policy_version"),
    "reward_mean": ("Mean episode reward of the last step", "reward_mean"),
    "success_rate": ("Share of successful episodes in the last step", "success_rate"),
    "turns_mean": ("Mean turns per episode in the last step", "turns_mean"),
    "truncation_at_horizon_rate": ("Share of episodes that ran out of turns",
                                   "truncated_at_horizon_rate"),
    "invalid_action_rate": ("Invalid actions per turn", "invalid_action_rate"),
    "repeated_action_rate": ("Turns repeating the previous action", "repeated_action_rate"),
    "tokens_per_second": ("Generated tokens per second of generation", "tokens_per_s"),
    "env_steps_per_second": ("Environment steps per second of env time", "env_steps_per_s"),
    "ingest_queue_depth": ("Trajectories waiting in the learner's ingest", "queue_depth"),
    "staleness_max": ("Largest policy-version lag of a trained trajectory", "staleness_max"),
    "learner_loss": ("Policy loss", "learner/loss"),
    "learner_kl": ("KL to the reference model", "learner/kl"),
    "learner_entropy": ("Policy entropy on model tokens", "learner/entropy"),
    "learner_grad_norm": ("Global gradient norm", "learner/grad_norm"),
    "learner_clip_fraction": ("Share of tokens with a clipped ratio", "learner/clip_frac"),
    "learner_groups_kept": ("Task groups the last update learned from", "learner/groups_kept"),
    # Credit assignment. The step-level (anchor-state, GiGPO) figures exist only for
    # estimators that compute them; GRPO has the episode-level ones alone.
    "learner_anchor_groups": ("Anchor-state groups of at least 2 turns in the last update",
                              "learner/anchor_groups"),
    "learner_anchor_group_size_mean": ("Mean turns per anchor-state group",
                                       "learner/anchor_group_size_mean"),
    "learner_anchor_group_size_max": ("Most turns in one anchor-state group",
                                      "learner/anchor_group_size_max"),
    "learner_step_adv_nonzero_share": ("Share of trained turns with a non-zero step-level "
                                       "advantage", "learner/step_adv_nonzero_share"),
    "learner_episode_adv_abs_mean": ("Mean |episode-level advantage| over trained turns",
                                     "learner/episode_adv_abs_mean"),
    "learner_episode_adv_std": ("Std of the episode-level advantage over trained turns",
                                "learner/episode_adv_std"),
    "learner_step_adv_abs_mean": ("Mean |step-level advantage| over trained turns",
                                  "learner/step_adv_abs_mean"),
    "learner_step_adv_std": ("Std of the step-level advantage over trained turns",
                             "learner/step_adv_std"),
    # Rollout correction: the sampler's (vLLM's) logprobs against the learner's pre-update
    # ones. The truncated and masked shares exist only with the correction on.
    "learner_mismatch_log_ratio_abs_mean": ("Mean |log(learner / vLLM)| over trained tokens",
                                            "learner/mismatch_log_ratio_abs_mean"),
    "learner_mismatch_log_ratio_abs_max": ("Largest |log(learner / vLLM)| of a trained token",
                                           "learner/mismatch_log_ratio_abs_max"),
    "learner_mismatch_kl": ("KL(vLLM || learner) per trained token (k3 estimate)",
                            "learner/mismatch_kl"),
    "learner_mismatch_truncated_share": ("Share of trained tokens whose importance weight "
                                         "is_cap truncates", "learner/mismatch_truncated_share"),
    "learner_mismatch_masked_share": ("Share of trained tokens in rows seq_mask_band masks",
                                      "learner/mismatch_masked_share"),
    "generator_rss_max_bytes": ("Resident memory of the largest generator process",
                                "generator_rss_max_bytes"),
    "weight_sync_seconds": ("Seconds to push weights to every generator",
                            "seconds/weight_sync"),
    # Outside agents (agent.callable): episodes whose agent rewrote its history, so some
    # turns were re-tokenised and train as rows of their own (actors/agent_sessions.py).
    "edited_history_rate": ("Share of episodes whose agent edited its history",
                            "edited_history_rate"),
}
COUNTERS = {
    "trajectories_ingested": "Trajectories the learner received",
    "trajectories_duplicate": "Duplicate trajectories the ingest discarded",
    "trajectories_dropped": "Trajectories generated but not trained on, by reason",
    "env_errors": "Episodes failed by an environment error or timeout",
    "env_restarts": "Environment actors restarted",
    "generator_restarts": "Generator actors restarted",
}
# Gauges also set per env (label env=<env label>) in multi-env runs.
PER_ENV = ("reward_mean", "success_rate", "turns_mean", "truncation_at_horizon_rate",
           "invalid_action_rate", "repeated_action_rate")
PHASES = ("generate", "env", "overlap", "transport", "learn", "weight_sync", "iteration")


def repeated_action_rate(trajs: Sequence[Trajectory]) -> float:
    """Share of turns whose action repeats the episode's previous action."""
    pairs = [(a, b) for t in trajs for a, b in zip(t.info.get("actions", []),
                                                   t.info.get("actions", [])[1:])]
    return sum(a == b for a, b in pairs) / max(len(pairs), 1)


class PrometheusExporter:
    """Serves /metrics on `host:port` and turns each iteration's figures into series."""

    def __init__(self, *, host: str, port: int, run: str, env: str) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"run": run, "env": env}
        r = self.registry
        self.gauges = {k: Gauge(f"horizonrl_{k}", h, LABELS, registry=r)
                       for k, (h, _) in GAUGES.items()}
        self.counters = {k: Counter(f"horizonrl_{k}", h,
                                    (*LABELS, "reason") if k == "trajectories_dropped"
                                    else LABELS, registry=r) for k, h in COUNTERS.items()}
        self.phase = Gauge("horizonrl_phase_seconds", "Seconds per phase in the last step",
                           (*LABELS, "phase"), registry=r)
        self.reward = Histogram("horizonrl_episode_reward", "Episode reward", LABELS,
                                buckets=(0.0, 0.25, 0.5, 0.75, 1.0), registry=r)
        self.turns = Histogram("horizonrl_episode_turns", "Turns per episode", LABELS,
                               buckets=(1, 2, 3, 5, 8, 13, 20, 30), registry=r)
        try:
            self.server, _ = start_http_server(port, addr=host, registry=r)
        except OSError as exc:
            raise RuntimeError(f"cannot serve metrics on {host}:{port} ({exc}); set "
                               "metrics.port=0 for any free port, or metrics.enabled=false"
                               ) from None
        self.address = f"{host}:{self.server.server_address[1]}"
        self._last: dict[str, float] = {}

    def observe(self, m: dict[str, Any], trajs: Sequence[Trajectory]) -> None:
        values = {**m, "step_done": m["step"] + 1}
        for k, (_, key) in GAUGES.items():
            if isinstance(values.get(key), (int, float)):
                self.gauges[k].labels(**self.labels).set(values[key])
        for env in {k.split("/")[1] for k in m if k.startswith("env/") and k.count("/") == 2}:
            for k in PER_ENV:
                v = m.get(f"env/{env}/{GAUGES[k][1]}")
                if isinstance(v, (int, float)):
                    self.gauges[k].labels(run=self.labels["run"], env=env).set(v)
        for phase in PHASES:
            self.phase.labels(**self.labels, phase=phase).set(m.get(f"seconds/{phase}", 0.0))
        for t in trajs:
            if t.failure is Failure.NONE:
                self.reward.labels(**self.labels).observe(t.reward)
                self.turns.labels(**self.labels).observe(t.num_turns)
        c = self.counters
        c["trajectories_ingested"].labels(**self.labels).inc(len(trajs))
        for key, total in m.items():  # the ledger's running totals, per drop reason
            if key.startswith("ledger/dropped/") and isinstance(total, (int, float)):
                reason = key.rsplit("/", 1)[1]
                self._add_total(c["trajectories_dropped"].labels(**self.labels, reason=reason),
                                key, total)
        c["env_errors"].labels(**self.labels).inc(m.get("failed_episodes", 0))
        for key, name in (("ingest_duplicates", "trajectories_duplicate"),
                          ("env_restarts", "env_restarts"),
                          ("generator_restarts", "generator_restarts")):
            self._add_total(c[name].labels(**self.labels), key, m.get(key, 0))

    def _add_total(self, counter: Any, key: str, total: float) -> None:
        """`total` arrives as a running total; a counter takes the increment since the last."""
        counter.inc(max(0.0, float(total) - self._last.get(key, 0.0)))
        self._last[key] = float(total)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def read_status(address: str, timeout_s: float = 5.0) -> dict[str, float]:
    """Scrape a running driver's /metrics and return the `horizonrl_*` samples by name."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("horizonrl_") and not s.name.endswith(("_bucket", "_created")):
                key = s.name + ("" if "phase" not in s.labels else f"{{{s.labels['phase']}}}")
                out[key] = out.get(key, 0.0) + s.value if s.name.endswith("_total") else s.value
    return out
