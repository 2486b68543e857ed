"""The embedded default trained across two hosts (bench/twohosts.py): generators and env
actors on host B, learner ranks and the driver on host A, placed by the custom resources of
configs/multinode-local.yaml; trajectories cross the veth to the ingest on A, weights cross it to
the generator on B. Host B's view of the checkout's `.cache/` and `runs/` is an empty tmpfs, so
the only directory both hosts share is the run's storage (run root and model folder); the
checkpoints land there, and a second cluster (fresh Ray, same two hosts) resumes the run from it
and continues."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import SUITE_MODEL

from bench.twohosts import TwoHosts, can_run

pytestmark = [pytest.mark.slow, pytest.mark.multinode,
              pytest.mark.skipif(can_run() is not None, reason=str(can_run()))]
ROOT = Path(__file__).resolve().parents[2]
TOKEN = {"HORIZONRL_INGEST_TOKEN": "multinode-test-token"}
NODE_LOCAL = [ROOT / ".cache", ROOT / "runs"]  # host B sees an empty tmpfs over each


@pytest.fixture()
def storage(tmp_path) -> Path:
    """The shared storage: `runs/` and `models/`, the base model copied in from this host's
    cache (built here first if missing), as a user would stage it on a shared volume."""
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.model.load import ensure_model

    for d in NODE_LOCAL:
        d.mkdir(exist_ok=True)
    cfg = load_config(ROOT / "configs/multinode-local.yaml",
                      [*SUITE_MODEL, f"model.cache_dir={ROOT / '.cache/models'}"])
    base = ensure_model(cfg.model, env=cfg.env)
    shutil.copytree(base, tmp_path / "storage" / "models" / base.name)
    return tmp_path / "storage"


def _args(hosts: TwoHosts, storage: Path) -> list[str]:
    return [f"ray.address={hosts.address}", "metrics.port=0", f"run_root={storage / 'runs'}",
            f"model.cache_dir={storage / 'models'}", *SUITE_MODEL]


def _train(hosts: TwoHosts, storage: Path, *extra: str):
    cmd = [sys.executable, "-m", "horizonrl.cluster.cli", "train", "--config",
           "configs/multinode-local.yaml", *_args(hosts, storage), *extra]
    out = hosts.run_on_a(cmd, cwd=ROOT, timeout=1200, env={**TOKEN, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return out


def _ledger(run_dir: Path) -> dict:
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["reconciled"] and ledger["unaccounted"] == 0 and ledger["conflicts"] == 0
    return ledger


def test_train_across_two_hosts_then_resume_on_a_second_cluster(tmp_path, storage):
    (tmp_path / "first").mkdir()
    with TwoHosts(tmp_path / "first", b_private=NODE_LOCAL) as hosts:
        _train(hosts, storage)
        a, b = hosts.ips
    (run_dir,) = (storage / "runs").iterdir()
    placed = json.loads((run_dir / "placement.json").read_text())
    assert placed["driver"] == a and set(placed["learner_ranks"]) == {a}
    assert set(placed["generators"]) == {b} and set(placed["env_actors"]) == {b}
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(10))
    assert (run_dir / "checkpoints/step_000005").is_dir()
    assert (run_dir / "checkpoints/step_000010").is_dir()
    first = _ledger(run_dir)
    assert first["generated"] == first["trained"] + first["dropped_total"] > 0

    (tmp_path / "second").mkdir()
    with TwoHosts(tmp_path / "second", b_private=NODE_LOCAL) as hosts:
        out = _train(hosts, storage, "iterations=13", "--resume", "auto")
    assert int(re.search(r"from step_(\d+) ", out.stdout).group(1)) == 10
    assert list((storage / "runs").iterdir()) == [run_dir]  # the same run went on
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(13))
    assert [x["policy_version"] for x in lines] == list(range(1, 14))
    assert (run_dir / "checkpoints/step_000013").is_dir()
    second = _ledger(run_dir)
    assert second["generated"] > first["generated"]


def test_ray_job_submit_to_host_a_runs_the_same_config(tmp_path, storage):
    """As a cluster user does it: `ray job submit` from a checkout to the head's job API, the
    token in the job's runtime env; the driver runs on the head (host A), and env actors asked
    for no node go where their generator is."""
    import yaml

    runtime_env = yaml.safe_load((ROOT / "deploy/runtime_env.yaml").read_text())
    runtime_env["env_vars"].update(TOKEN)
    (tmp_path / "runtime_env.yaml").write_text(yaml.safe_dump(runtime_env))
    with TwoHosts(tmp_path, dashboard=True, b_private=NODE_LOCAL) as hosts:
        cmd = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address",
               hosts.jobs_url, "--working-dir", ".", "--runtime-env",
               str(tmp_path / "runtime_env.yaml"), "--", "horizonrl", "train", "--config",
               "configs/multinode-local.yaml", "iterations=3", "checkpoint_every=3",
               # No resources for the env actors: they follow their generator to host B
               # (env.colocate) though host A has room for them.
               "env.resources={}", f"run_root={storage / 'runs'}",
               f"model.cache_dir={storage / 'models'}", "metrics.port=0", *SUITE_MODEL]
        out = hosts.run_on_a(cmd, cwd=ROOT, timeout=1200)
        a, b = hosts.ips
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "succeeded" in out.stdout
    (run_dir,) = (storage / "runs").iterdir()
    placed = json.loads((run_dir / "placement.json").read_text())
    assert placed["driver"] == a and set(placed["learner_ranks"]) == {a}
    assert set(placed["generators"]) == {b} and set(placed["env_actors"]) == {b}
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2] and (run_dir / "checkpoints/step_000003").is_dir()
    _ledger(run_dir)


def test_losing_the_rollout_host_stops_with_a_resumable_checkpoint(tmp_path, storage):
    """Host B (generator and env actors) dies mid-run. No other node offers `rollout_node`, so
    the replacement generator cannot be placed: the run saves a checkpoint with the learner's
    latest weights, stops with exit 3 and says why, and the ledger reconciles with the lost
    episodes counted. Each env step takes 20 ms more (the fault-injection env around BabyAI),
    so a rollout lasts seconds and B is lost in the middle of one."""
    (model,) = (storage / "models").iterdir()
    slow = ("env.kwargs={env: babyai, env_kwargs: {level: BabyAI-GoToRedBall-v0, reward: "
            "binary}, fault: sleep, at_step: 1, sleep_s: 0.02}")
    with TwoHosts(tmp_path, b_private=NODE_LOCAL) as hosts:
        run = hosts.popen_on(
            0, [sys.executable, "-m", "horizonrl.cluster.cli", "train", "--config",
                "configs/multinode-local.yaml", *_args(hosts, storage), "iterations=40",
                "checkpoint_every=3", "generator.restart_timeout_s=45", f"model.path={model}",
                "env.name=faulty", slow],
            stdout=(tmp_path / "train.log").open("w"), cwd=ROOT,
            env={**TOKEN, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.monotonic() + 900
            while not list(storage.glob("runs/*/checkpoints/step_000003")):
                assert run.poll() is None, (tmp_path / "train.log").read_text()[-4000:]
                assert time.monotonic() < deadline, "no checkpoint at step 3 within 900 s"
                time.sleep(0.5)
            time.sleep(2.0)  # into the next rollout
            hosts.lose_host_b()
            rc = run.wait(timeout=600)
        finally:
            if run.poll() is None:
                run.kill()
    log = (tmp_path / "train.log").read_text()
    assert rc == 3, log[-4000:]
    assert "generator gen0 died" in log and "generator.restart_timeout_s" in log
    (run_dir,) = (storage / "runs").iterdir()
    stopped_at = int(re.search(r"checkpoints/step_(\d+)\)", log).group(1))
    assert 3 <= stopped_at < 40
    state = json.loads((run_dir / f"checkpoints/step_{stopped_at:06d}/trainer_state.json")
                       .read_text())
    assert state["step"] == stopped_at
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(stopped_at))
    # Episodes of a rollout in flight when B died count as generator_error (a death found at
    # the weight push, between rollouts, would lose none); every id has its fate.
    ledger = _ledger(run_dir)
    assert ledger["generated"] == ledger["trained"] + ledger["dropped_total"] > 0
    if "died in step" in log:
        assert ledger["generator_error_episodes"] == 64  # the whole rollout: 8 tasks x 8
    where = "the weight push" if "during the weight push" in log else "a rollout"
    print(f"node loss found at {where}: stopped at step {stopped_at}; ledger {ledger}")
