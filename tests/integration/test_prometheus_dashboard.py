"""Every PromQL expression of the Grafana dashboard returns data from a real Prometheus
(Debian's `prometheus`, on 127.0.0.1) scraping a real short training run."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import ONE_RANK, SUITE_MODEL

from horizonrl.cluster.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/horizonrl.json"
# Series only step-level estimators (GiGPO's anchor-state groups) set; the GRPO run below has
# none, and an absent figure makes no series (cluster/ops/prometheus.py), so no data is right.
STEP_LEVEL_ONLY = ("horizonrl_learner_anchor_", "horizonrl_learner_step_adv_")


def dashboard_queries() -> list[str]:
    """Panel expressions with Grafana's variables as a user's 'All' selection resolves them."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]  # rows: none
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    out = []
    for e in exprs:
        e = e.replace("$env", ".*").replace("$run", ".*").replace("$__rate_interval", "1m")
        if e.startswith("label_values("):  # a Grafana function: the metric selector inside
            e = e[len("label_values("):].rsplit(",", 1)[0]
        out.append(e)
    return out



def _query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=QUERY_TIMEOUT_S) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def test_dashboard_has_stable_uid_and_variables():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "horizonrl-training"
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "env", "run"} <= names
    assert all(e.count("horizonrl_") >= 1 for e in dashboard_queries())


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="Debian's prometheus is not installed (.ci/run and "
                           "`make install-dev` install it)")
def test_every_dashboard_query_returns_data(tmp_path, free_port):
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        *SUITE_MODEL, ONE_RANK,
        "name=prom", "iterations=8", f"run_root={tmp_path}", "metrics.port=0",
        "generator.tasks_per_step=2", "generator.group_size=4", "env.replicas_per_actor=8",
        "learner.minibatches=1",
        # The rollout correction on, so its truncated and masked shares have series too.
        "learner.decoupled_loss=true", "learner.seq_mask_band=[0.5,2.0]"])
    with ray_session(cfg.ray), Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: horizonrl\n"
            f"    static_configs: [{{targets: ['{trainer.exporter.address}']}}]\n")
        prom, prom_port = _start_prometheus(tmp_path, free_port)
        try:
            missing = [e for e in dashboard_queries()
                       if not any(name in e for name in STEP_LEVEL_ONLY)]
            # Bounded in count and time: at most 8 steps, then 30 s of scrapes, 3 min in all
            # (a query that hangs costs QUERY_TIMEOUT_S, not the suite's 15-minute timeout).
            deadline = time.monotonic() + 180
            for _ in range(cfg.iterations):
                trainer.step()
                time.sleep(1.5)
                missing = _without_data(prom, prom_port, missing, deadline)
                if not missing:
                    break
            scrapes = min(deadline, time.monotonic() + 30)
            while missing and time.monotonic() < scrapes:
                time.sleep(2)
                missing = _without_data(prom, prom_port, missing, scrapes)
            assert not missing, f"dashboard queries without data: {missing}"
        finally:
            prom.terminate()
            prom.wait(timeout=30)


QUERY_TIMEOUT_S = 5


def _start_prometheus(tmp_path: Path, free_port) -> tuple[subprocess.Popen, int]:
    """Prometheus on a free port, answering /-/ready. The port is picked, released and then
    bound by Prometheus: another process (a Ray worker, an ingest) can take it in between, and
    Prometheus then exits. That is retried on another port, twice at most."""
    for _ in range(3):
        port = free_port()
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while prom.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready",
                                            timeout=QUERY_TIMEOUT_S) as resp:
                    if resp.status == 200:
                        return prom, port
            except OSError:
                time.sleep(0.5)
        prom.kill()
        prom.wait(timeout=30)
    pytest.fail("Prometheus did not start on a free port in 3 tries")


def _without_data(prom: subprocess.Popen, port: int, exprs: list[str],
                  deadline: float) -> list[str]:
    """The expressions that return no data yet (all of those left once `deadline` passes)."""
    assert prom.poll() is None, f"Prometheus exited with {prom.returncode}"
    return [e for e in exprs if time.monotonic() > deadline or not _query_safe(port, e)]


def _query_safe(port: int, expr: str) -> list:
    try:
        return _query(port, expr)
    except OSError:  # Prometheus still starting
        return []
