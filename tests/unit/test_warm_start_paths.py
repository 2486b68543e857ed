"""A finished warm start is found in the run's own folder, wherever the run was copied from;
the demonstrations RL replays are drawn reproducibly per step."""

import json
import shutil

import pytest

from horizonrl.cluster.warm_start.recipe import DONE_FILE, INIT_DIR, DemoReplay, warm_start_model


def test_copied_run_uses_its_own_clone(tmp_path):
    origin = tmp_path / "origin" / "run"
    (origin / INIT_DIR / "model").mkdir(parents=True)
    assert warm_start_model(origin) is None  # not finished yet
    (origin / INIT_DIR / DONE_FILE).write_text(json.dumps(
        {"model": str((origin / INIT_DIR / "model").resolve())}))
    copy = tmp_path / "variant" / "run"
    shutil.copytree(origin, copy)
    shutil.rmtree(tmp_path / "origin")  # the run it was copied from is gone
    assert warm_start_model(copy) == (copy / INIT_DIR / "model").resolve()


def test_replay_draws_are_a_function_of_seed_and_step():
    demos = list(range(100))
    a, b = DemoReplay(demos, 8, seed=3), DemoReplay(demos, 8, seed=3)
    draws = [a.draw(step) for step in range(20)]
    assert draws == [b.draw(step) for step in range(20)]  # a resumed run replays the same
    assert all(len(d) == len(set(d)) == 8 for d in draws)
    assert len({tuple(d) for d in draws}) == 20  # each step draws afresh
    assert len({x for d in draws for x in d}) > 70  # ... from all of the demonstrations
    assert DemoReplay(demos, 8, seed=4).draw(0) != draws[0]
    assert sorted(DemoReplay(demos[:5], 8, seed=0).draw(0)) == demos[:5]  # batch capped
    with pytest.raises(ValueError, match="no demonstrations"):
        DemoReplay([], 8, seed=0)
