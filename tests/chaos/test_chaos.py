"""Chaos on the real local stack (Ray, vLLM, gRPC, DeepSpeed): a fault is injected mid-run and
every test ends with the trajectory ledger reconciled (0 lost, 0 duplicated) and training going
on. Faults come from `envpool.faults` (deterministic: at a chosen env step, once per drill) or
from SIGKILL of a real actor process."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import suite_model

from horizonrl.cluster.config import load_config

# Each case trains a whole run and kills a part of it (40-80 s each on 2 cores): the slow set,
# which CI runs, and `make test-chaos`. The default suite keeps the pool-level faults
# (tests/integration/test_envpool_faults.py) and the checkpoint after a lost weight push
# (tests/unit/test_push_loss_checkpoint.py).
pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _default_model() -> str:
    """The default config's tiny model as the suite builds it (conftest.SUITE_MODEL: built on
    first use, then cached), so groups have successes and updates happen. Passed as
    model.path: the fault-injecting env must never be used to build a model (its fault would
    fire in the builder)."""
    return str(suite_model())


def _cfg(tmp_path, fault: dict | None = None, *extra: str):
    """The embedded default at a small scale, optionally on the fault-injecting env."""
    env = ["env.replicas_per_actor=8", "env.num_actors=2", "env.call_timeout_s=5"]
    if fault is not None:
        fault = {"env": "babyai", "env_kwargs": {"level": "BabyAI-GoToRedBall-v0"},
                 "once_file": str(tmp_path / "fired"), **fault}
        env += ["env.name=faulty", f"env.kwargs={fault}"]
    return load_config(ROOT / "configs/babyai-local.yaml", [
        "name=chaos", "iterations=3", "metrics.port=0", f"run_root={tmp_path / 'runs'}",
        f"model.path={_default_model()}", "generator.tasks_per_step=4",
        "generator.group_size=4", "curriculum.horizons=[5]", "learner.minibatches=1",
        "checkpoint_every=0", *env, *extra])


def _assert_reconciled(trainer, metrics):
    led = trainer.ledger.summary()
    print(f"\nledger: {led}")
    assert led["reconciled"] and led["conflicts"] == 0 and led["unaccounted"] == 0
    assert led["generated"] == led["trained"] + led["dropped_total"]
    ids = [m["step"] for m in metrics]
    assert ids == list(range(len(ids)))  # training went on, one line per step
    return led


def _run(cfg, steps=3, during=None):
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    with ray_session(cfg.ray), Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        if during is not None:
            threading.Thread(target=during, args=(trainer,), daemon=True).start()
        metrics = [trainer.step() for _ in range(steps)]
        return trainer, metrics, _assert_reconciled(trainer, metrics)


def test_env_replica_process_dies_mid_episode(tmp_path):
    cfg = _cfg(tmp_path, {"fault": "exit", "at_step": 6})
    _trainer, metrics, led = _run(cfg)
    assert led["dropped"].get("env_error", 0) >= 1  # the dead actor's episodes, masked out
    assert sum(m["env_restarts"] > 0 for m in metrics) >= 1
    assert led["trained"] > 0


def test_env_step_hangs_and_is_cut_by_the_timeout(tmp_path):
    cfg = _cfg(tmp_path, {"fault": "sleep", "at_step": 6, "sleep_s": 30})
    _trainer, _metrics, led = _run(cfg)
    assert led["dropped"].get("timeout", 0) >= 1


def test_generator_killed_mid_rollout(tmp_path):
    """The env hangs (once) so the rollout is surely in flight; then the generator's process is
    SIGKILLed. The driver restarts it (weights and horizon restored) and re-runs its tasks
    under new ids."""
    cfg = _cfg(tmp_path, {"fault": "sleep", "at_step": 10, "sleep_s": 4},
               "env.call_timeout_s=60")
    fired = tmp_path / "fired"

    def kill_generator(trainer):
        import ray

        pid = ray.get(trainer.generators[0].health.remote())["pid"]
        deadline = time.monotonic() + 120
        while not fired.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)

    trainer, metrics, led = _run(cfg, during=kill_generator)
    assert trainer.fleet.restarts == 1
    assert led["generator_error_episodes"] >= 16  # its whole share, re-issued
    assert metrics[-1]["policy_version"] == 3


def test_ingest_restarted_under_load(tmp_path):
    """The learner's gRPC ingest goes down for 6 s mid-rollout, once part of a step's episodes
    has arrived, and comes back on the same port. The generator's next pushes meet a stopped
    ingest, wait for it (gRPC wait_for_ready, within the push deadline) and are delivered once
    it is back; what the ingest held before the stop is kept."""
    cfg = _cfg(tmp_path)
    per_step, seen = 16, {}

    def restart_ingest(trainer):
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # until a step is partly delivered
            got = trainer.ingest.stats()["received"]
            if got % per_step:
                break
            time.sleep(0.005)
        seen.update(step=trainer.step_count, received_before=got)
        trainer.ingest.stop(grace=0)
        time.sleep(6)
        seen["restarted"] = trainer.ingest.start().serving

    trainer, metrics, led = _run(cfg, during=restart_ingest)
    print(f"restart: {seen}, transport seconds: {[m['seconds']['transport'] for m in metrics]}")
    assert seen.get("restarted") and seen["received_before"] % per_step
    # that step's later pushes waited for the ingest
    assert metrics[seen["step"]]["seconds"]["transport"] > 2.0
    assert trainer.fleet.restarts == 0
    assert led["generated"] == 3 * per_step and led["trained"] > 0
    assert not set(led["dropped"]) - {"zero_variance"}  # nothing lost to the restart
    assert trainer.ingest.stats()["received"] == 3 * per_step  # each stored once


def test_learner_rank_killed_then_resume(tmp_path):
    import ray

    from horizonrl.cluster.ops.checkpoints import load_resume
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import LearnerLost, Trainer

    cfg = _cfg(tmp_path)
    run_dir = make_run_dir(cfg)
    with ray_session(cfg.ray), Trainer(cfg, run_dir=run_dir) as trainer:
        trainer.step()
        ckpt = trainer.save_checkpoint()
        trainer.step()  # this step is lost with the learner; resume re-runs it
        pid = ray.get(trainer.learner.workers[1].health.remote())["pid"]
        os.kill(pid, signal.SIGKILL)
        time.sleep(1)
        with pytest.raises(LearnerLost, match="--resume auto"):
            trainer.step()
    state = load_resume(ckpt)
    with ray_session(cfg.ray), Trainer(cfg, run_dir=run_dir, resume=state) as trainer:
        assert trainer.step_count == 1 and trainer.policy_version == 1
        metrics = [trainer.step() for _ in range(2)]
        led = trainer.ledger.summary()
    print(f"\nledger after resume: {led}")
    assert [m["step"] for m in metrics] == [1, 2] and metrics[-1]["policy_version"] == 3
    assert led["reconciled"] and led["generated"] == 3 * 16


def test_generator_killed_during_a_broadcast_push(tmp_path):
    """Weights go out by broadcast (gloo here, NCCL on GPUs). On the second push the generator's
    process is SIGKILLed right after learner rank 0 has started sending: the push fails for it,
    rank 0 is freed by the group's timeout, the generator is restarted and re-synced through the
    object store, the push is repeated over a re-formed group, and training goes on."""
    import ray

    cfg = _cfg(tmp_path, None, "learner.weight_sync=broadcast",
               "learner.weight_sync_timeout_s=20")
    pushes = []

    def kill_mid_push(trainer):
        send = trainer.learner.broadcast_weights_refs
        pid = ray.get(trainer.generators[0].health.remote())["pid"]

        def send_then_kill(buckets):
            refs = send(buckets)
            pushes.append(len(refs))
            if len(pushes) == 2:
                os.kill(pid, signal.SIGKILL)
            return refs

        trainer.learner.broadcast_weights_refs = send_then_kill

    trainer, metrics, _led = _run(cfg, during=kill_mid_push)
    assert trainer.fleet.restarts == 1
    assert len(pushes) == 4  # 3 steps, the second pushed twice
    assert [m["policy_version"] for m in metrics] == [1, 2, 3]
    assert all(m["weight_sync"]["weight_sync_bytes"] > 0 for m in metrics)
