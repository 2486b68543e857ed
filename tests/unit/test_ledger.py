"""The trajectory ledger: one fate per id, reasons counted, reconciliation that can fail."""

from __future__ import annotations

import json

import pytest

from horizonrl.cluster.train.ledger import Ledger


def test_reconciles_when_every_id_has_one_fate(tmp_path):
    led = Ledger(tmp_path)
    led.add_generated(["a", "b", "c", "d"])
    led.add_trained(["a", "b"], step=0)
    led.add_dropped(["c"], "zero_variance", step=0)
    led.add_dropped(["d"], "env_error", step=0)
    led.add_generator_error(3, step=0)
    s = led.close()
    assert s == {"generated": 4, "trained": 2, "dropped": {"env_error": 1, "zero_variance": 1},
                 "dropped_total": 2, "unaccounted": 0, "generator_error_episodes": 3,
                 "resampled_episodes": 0,
                 "conflicts": 0, "reconciled": True}
    assert json.loads((tmp_path / "ledger.json").read_text())["reconciled"] is True
    assert len((tmp_path / "ledger.jsonl").read_text().splitlines()) == 4


def test_unaccounted_double_fates_and_unknown_ids_break_it(capsys):
    led = Ledger()
    led.add_generated(["a", "b"])
    led.add_trained(["a"], step=0)
    assert led.summary()["unaccounted"] == 1 and not led.summary()["reconciled"]
    led.add_trained(["b"], step=1)
    assert led.summary()["reconciled"]
    led.add_dropped(["b"], "stale", step=1)  # b was trained already
    led.add_trained(["zzz"], step=1)         # never generated
    s = led.close()
    assert s["conflicts"] == 2 and not s["reconciled"]
    assert "DOES NOT RECONCILE" in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown drop reason"):
        led.add_dropped(["a"], "because", step=2)


def test_resume_keeps_the_steps_before_the_checkpoint(tmp_path):
    led = Ledger(tmp_path)
    for step in range(3):
        ids = [f"s{step}-{k}" for k in range(2)]
        led.add_generated(ids)
        led.add_trained(ids[:1], step=step)
        led.add_dropped(ids[1:], "zero_variance", step=step)
        led.flush()
    led._log.write('{"step": 2, "id": "cut')  # a line cut short by SIGKILL
    led._log.flush()
    again = Ledger.resume(tmp_path, step=2)  # steps 2+ are about to be re-run
    s = again.summary()
    assert s["generated"] == 4 and s["trained"] == 2 and s["reconciled"]
    again.add_generated(["new"])
    again.add_trained(["new"], step=2)
    assert again.close()["generated"] == 5


def test_resume_drops_generator_errors_of_the_re_run_steps(tmp_path):
    led = Ledger(tmp_path)
    led.add_generator_error(4, step=0)
    led.add_generator_error(8, step=2)  # step 2 is re-run after the resume: not counted twice
    led.close()
    assert Ledger.resume(tmp_path, step=2).summary()["generator_error_episodes"] == 4


def test_resampled_episodes_count_once_per_resume_of_a_step(tmp_path):
    led = Ledger(tmp_path)
    led.add_resampled(4, step=1)  # a resume at step 1 re-issued one rollout of 4 episodes
    led.add_resampled(0, step=2)
    led.close()
    again = Ledger.resume(tmp_path, step=3)
    assert again.summary()["resampled_episodes"] == 4
    again.add_resampled(4, step=3)
    again.close()
    # Killed again and resumed from step 3's checkpoint: that step's count is replaced.
    third = Ledger.resume(tmp_path, step=3)
    third.add_resampled(4, step=3)
    assert third.summary()["resampled_episodes"] == 8 and third.summary()["reconciled"]
