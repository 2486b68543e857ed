"""The exporter's gauges and the Grafana dashboard that reads them, without Prometheus or Ray:
every `horizonrl_*` name a panel queries is registered, panels neither overlap nor share ids,
and a step's learner figures land in their gauges (absent ones make no series)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from horizonrl.cluster.ops.prometheus import PrometheusExporter

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/grafana/horizonrl.json"
LABELS = {"run": "r", "env": "e"}
# Sample names each metric type serves next to its family name.
SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
CREDIT = {  # metric key -> gauge: what a GiGPO update with the rollout correction reports
    "learner/groups_kept": "learner_groups_kept",
    "learner/anchor_groups": "learner_anchor_groups",
    "learner/anchor_group_size_mean": "learner_anchor_group_size_mean",
    "learner/anchor_group_size_max": "learner_anchor_group_size_max",
    "learner/step_adv_nonzero_share": "learner_step_adv_nonzero_share",
    "learner/episode_adv_abs_mean": "learner_episode_adv_abs_mean",
    "learner/episode_adv_std": "learner_episode_adv_std",
    "learner/step_adv_abs_mean": "learner_step_adv_abs_mean",
    "learner/step_adv_std": "learner_step_adv_std",
    # rollout correction
    "learner/mismatch_log_ratio_abs_mean": "learner_mismatch_log_ratio_abs_mean",
    "learner/mismatch_log_ratio_abs_max": "learner_mismatch_log_ratio_abs_max",
    "learner/mismatch_kl": "learner_mismatch_kl",
    "learner/mismatch_truncated_share": "learner_mismatch_truncated_share",
    "learner/mismatch_masked_share": "learner_mismatch_masked_share",
}


@pytest.fixture
def exporter():
    exp = PrometheusExporter(host="127.0.0.1", port=0, run="r", env="e")
    yield exp
    exp.close()


def test_dashboard_queries_only_registered_metrics(exporter):
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    queried = {n for e in exprs for n in re.findall(r"\bhorizonrl_\w+", e)}
    served = {f.name + s for f in exporter.registry.collect() for s in SUFFIXES.get(f.type, ())}
    assert queried and queried <= served, sorted(queried - served)


def test_dashboard_panels_do_not_overlap_and_ids_are_unique():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    boxes = [(p["title"], p["gridPos"]) for p in panels]
    for i, (a, ga) in enumerate(boxes):
        assert ga["x"] + ga["w"] <= 24, a  # Grafana's grid is 24 columns wide
        for b, gb in boxes[i + 1:]:
            apart = (ga["x"] + ga["w"] <= gb["x"] or gb["x"] + gb["w"] <= ga["x"]
                     or ga["y"] + ga["h"] <= gb["y"] or gb["y"] + gb["h"] <= ga["y"])
            assert apart, (a, b)


def test_credit_assignment_figures_set_their_gauges(exporter):
    figures = {key: float(i + 1) for i, key in enumerate(CREDIT)}
    exporter.observe({"step": 0, **figures}, [])
    for key, gauge in CREDIT.items():
        value = exporter.registry.get_sample_value(f"horizonrl_{gauge}", LABELS)
        assert value == figures[key], gauge


def test_absent_figures_make_no_series_and_keep_the_last_value(exporter):
    episode_only = {"learner/groups_kept": 4.0, "learner/episode_adv_abs_mean": 0.8,
                    "learner/episode_adv_std": 0.9}  # a GRPO update
    exporter.observe({"step": 0, **episode_only}, [])
    get = exporter.registry.get_sample_value
    assert get("horizonrl_learner_episode_adv_std", LABELS) == 0.9
    assert get("horizonrl_learner_anchor_groups", LABELS) is None  # no series, not a 0
    assert get("horizonrl_learner_step_adv_std", LABELS) is None
    exporter.observe({"step": 1}, [])  # e.g. a skipped update: the gauge is left alone
    assert get("horizonrl_learner_groups_kept", LABELS) == 4.0
