"""`horizonrl eval` machinery on the real stack: the same seeds give the same numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from horizonrl.cluster.config import load_config
from horizonrl.envpool.config import EnvConfig

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # two evaluations, each with its own Ray and vLLM (~40 s); the default set's
# training-loop test runs the periodic evaluation on the whole stack
def test_evaluation_is_reproducible(tiny_model_path, tmp_path, monkeypatch):
    """Twice, the second time with the run's ingest token set (the ingest then refuses a
    generator that does not send it): the same numbers both times."""
    from horizonrl.cluster.eval.evaluate import evaluate

    cfg = load_config(ROOT / "configs/babyai-local.yaml", ["metrics.port=0"])
    env = EnvConfig(replicas_per_actor=8)
    runs = []
    for i in range(2):
        if i == 1:
            monkeypatch.setenv(cfg.learner.ingest.auth_token_env, "eval-token")
        out = tmp_path / f"eval{i}"
        results = evaluate(cfg, {"base": str(tiny_model_path)}, envs=[env], tasks=4, samples=2,
                           max_turns=[2, 4], out=out)
        runs.append(((out / "episodes.jsonl").read_text(), results))
    (a, res_a), (b, res_b) = runs
    assert a == b and res_a == res_b
    lines = a.splitlines()
    assert len(lines) == 4 * 2 * 2  # tasks x samples x turn budgets
    cell = res_a["base"]["babyai"]["4"]
    assert cell["episodes"] == 8 and set(cell["pass_at_k"]) == {"1", "2"}
    assert all((tmp_path / "eval0" / f).exists() for f in ("results.md", "pass_at_k.png"))


@pytest.mark.slow  # ~40 s (a CLI subprocess with its own Ray and vLLM); CI runs the slow set
def test_eval_cli_records_its_command_beside_the_report(tiny_model_path, tmp_path):
    """`horizonrl eval` writes command.json next to results.json: its command splits back into
    the arguments given, so `make figures` (bench/figures.py) can run the evaluation again."""
    import json
    import shlex
    import subprocess
    import sys

    out = tmp_path / "docs" / "ev"
    args = ["eval", "--config", "configs/babyai-local.yaml", "--model", str(tiny_model_path),
            "--envs", "babyai", "--tasks", "2", "--max-turns", "2", "--out", str(out),
            "metrics.port=0", "env.replicas_per_actor=2"]
    proc = subprocess.run([sys.executable, "-m", "horizonrl.cluster.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    written = json.loads((out / "command.json").read_text())
    assert shlex.split(written["command"]) == ["horizonrl", *args]
    assert list(written["models"].values()) == [str(tiny_model_path)]
    assert written["split"] == "eval"
    assert "command" not in json.loads((out / "results.json").read_text())
