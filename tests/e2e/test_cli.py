"""The CLI as a user runs it: `horizonrl train` in a subprocess on a tiny config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SUITE_MODEL

from horizonrl.protos.precision import bf16_native, learner_dtype

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "horizonrl.cluster.cli"]
# vLLM and the learner on the same weights: fp32 kernels agree to rounding; bf16 ones round
# differently (8 mantissa bits) at every layer: 0.093 on the probe when this was written. That
# the exported weights are the learner's is checked exactly by export-hf itself (transformers in
# the probe's precision, 1e-4).
PROBE_TOL = {"float32": 1e-4, "bfloat16": 0.3}


def test_bad_override_names_the_field():
    out = subprocess.run([*CLI, "train", "--config", "configs/babyai-local.yaml",
                          "learner.zero_stage=7"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "learner.zero_stage" in out.stderr


def test_dry_run_names_missing_gpus():
    out = subprocess.run([*CLI, "train", "--config", "configs/babyai-local.yaml", "--dry-run",
                          "generator.num_gpus=2", "generator.num_generators=2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "does not fit: GPU: needs 4" in out.stdout
    ok = subprocess.run([*CLI, "train", "--config", "configs/babyai-local.yaml", "--dry-run"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "fits: CPU 2.5/4" in ok.stdout


def test_status_without_a_run_says_so(tmp_path):
    out = subprocess.run([*CLI, "status", "127.0.0.1:1"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1 and "no training answers" in out.stderr


def test_a_run_the_cluster_cannot_hold_fails_at_start_saying_what_is_missing(tmp_path):
    """A local Ray of 1 CPU for actors that need 2.5: instead of hanging on the first actor
    that cannot be placed, the run waits the configured 2 s, then stops naming the shortfall,
    before it builds a model (a first-use build takes minutes) and before a run dir exists."""
    runs, models = tmp_path / "runs", tmp_path / "models"
    out = subprocess.run(
        [*CLI, "train", "--config", "configs/babyai-local.yaml", *SUITE_MODEL, "ray.num_cpus=1",
         "ray.wait_for_resources_s=2", "metrics.port=0", f"run_root={runs}",
         f"model.cache_dir={models}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "waiting for resources (CPU: needs 2.5, free now 1)" in out.stdout
    assert "does not fit the Ray cluster: CPU: needs 2.5, free now 1" in out.stderr
    assert not runs.exists() or not list(runs.iterdir()), "it left a run dir"
    assert not models.exists() or not list(models.iterdir()), "it built a model first"


def test_train_cli_writes_run_dir(tmp_path):
    out = subprocess.run(
        [*CLI, "train", "--config", "configs/babyai-local.yaml", *SUITE_MODEL, "name=e2e",
         "iterations=2", "metrics.port=0",
         f"run_root={tmp_path}", "checkpoint_every=1", "generator.tasks_per_step=2",
         "generator.group_size=4", "env.replicas_per_actor=8"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "step   2/2" in out.stdout
    (run_dir,) = tmp_path.iterdir()
    # A quiet console: no actor's output (Ray prefixes it "(GeneratorActor pid=N)"); it is in
    # the Ray session's logs, which the run dir links.
    console = out.stdout + out.stderr
    for actor in ("GeneratorActor", "LearnerWorker", "EnvWorker"):
        assert f"({actor} pid=" not in console, console[-3000:]
    logs = run_dir / "ray-logs"
    assert logs.is_symlink() and "(run_dir/ray-logs)" in console
    assert any(":actor_name:GeneratorActor" in p.read_text(errors="replace")
               for p in logs.glob("worker-*.out")), "the generator's output is not in ray-logs"
    assert (run_dir / "config.yaml").read_text().startswith("name: e2e")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all("success_rate" in x for x in lines)
    assert list((run_dir / "tensorboard").iterdir()), "no TensorBoard events written"
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["step_000001", "step_000002"]
    state = json.loads((run_dir / "checkpoints/step_000002/trainer_state.json").read_text())
    assert state["policy_version"] == 2 and state["step"] == 2
    assert (run_dir / "checkpoints/step_000002/config.json").exists()

    # export-hf: a plain save_pretrained folder that transformers (checked by the CLI against
    # the learner's probe logprobs) and vLLM both load and agree on.
    export = tmp_path / "export"
    out = subprocess.run([*CLI, "export-hf", str(run_dir), str(export)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr[-3000:]
    assert not (export / "learner").exists() and (export / "tokenizer.json").exists()
    probe = json.loads((run_dir / "checkpoints/step_000002/logprob_probe.json").read_text())
    # The default's `auto` precision, resolved on this machine, is what the learner trained in.
    precision = json.loads((run_dir / "precision.json").read_text())
    assert probe["dtype"] == precision["learner"] == learner_dtype(
        "auto", native_bf16=bf16_native("cpu"))
    dtype = probe["dtype"]  # the learner and the engine name precisions alike
    script = (
        "import json, sys\n"
        "from actors.engine import VLLMEngine\n"
        f"e = VLLMEngine({str(export)!r}, seed=0, max_model_len=256, stop_token_ids=[0], "
        f"dtype={dtype!r})\n"
        f"print('LOGPROBS', json.dumps(e.score([{probe['input_ids']!r}])[0]))\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("LOGPROBS ")), None)
    assert line is not None, out.stderr[-3000:]
    vllm = json.loads(line[len("LOGPROBS "):])
    diff = max(abs(a - b) for a, b in zip(vllm, probe["logprobs"]))
    print(f"\nexported model in vLLM ({dtype}) vs learner on the probe: max diff {diff:.2e}")
    assert diff < PROBE_TOL[dtype]


@pytest.mark.slow  # a whole run stopped mid-way (~35 s): with the kill-and-resume tests
def test_sigterm_stops_after_the_iteration_with_a_checkpoint(tmp_path):
    """A pod's termination notice (SIGTERM) ends the run cleanly: the running iteration
    finishes, a checkpoint is written, the ledger closes reconciled, exit code 0."""
    import signal
    import time

    proc = subprocess.Popen(
        [*CLI, "train", "--config", "configs/babyai-local.yaml", *SUITE_MODEL, "name=term",
         "iterations=200", "metrics.port=0", f"run_root={tmp_path}", "checkpoint_every=0",
         "generator.tasks_per_step=2", "generator.group_size=4", "env.replicas_per_actor=8"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    deadline = time.monotonic() + 600
    for line in proc.stdout:  # bounded by the deadline below and the process's own end
        lines.append(line)
        if "step   3/200" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    text = "".join(lines) + out
    assert proc.returncode == 0, text[-3000:]
    assert "stopped by SIGTERM after step" in text
    (run_dir,) = tmp_path.iterdir()
    ckpts = sorted((run_dir / "checkpoints").iterdir())
    assert ckpts and ckpts[-1].name >= "step_000003"
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["reconciled"] and ledger["generated"] > 0
