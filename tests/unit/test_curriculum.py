"""ScalingInter-RL schedule: step -> horizon at and around stage boundaries, and broadcasts."""

import pytest
from pydantic import ValidationError

from actors.config import CurriculumConfig
from actors.curriculum import CurriculumActor, horizon_at

CFG = CurriculumConfig(schedule="stepwise", horizons=[6, 13, 20], steps_per_stage=100)


@pytest.mark.parametrize("step,horizon", [
    (0, 6), (1, 6), (99, 6), (100, 13), (101, 13), (102, 13), (199, 13), (200, 20), (201, 20),
    (10_000, 20),
])
def test_stepwise_boundaries(step, horizon):
    assert horizon_at(CFG, step) == horizon


def test_resume_at_boundary_does_not_skip_a_stage():
    # AgentGym-RL's resume at step 100 jumped to h3 at 102; a fresh actor at 100 must say h2.
    actor = CurriculumActor(CFG, step=100)
    assert actor.current() == (13, 0)
    assert actor.tick(102) == (13, 0)
    state = actor.get_state()
    resumed = CurriculumActor(CFG)
    resumed.set_state(state)
    assert resumed.current() == actor.current()


def test_fixed_schedule_and_validation():
    assert horizon_at(CurriculumConfig(schedule="fixed", horizons=[15]), 999) == 15
    with pytest.raises(ValidationError, match="rise strictly"):
        CurriculumConfig(schedule="stepwise", horizons=[5, 5])
    with pytest.raises(ValueError, match="step must be"):
        horizon_at(CFG, -1)


class _Gen:
    def __init__(self):
        self.calls = []

    def set_horizon(self, h, v):
        self.calls.append((h, v))


def test_broadcast_on_change_only():
    cfg = CurriculumConfig(horizons=[2, 4], steps_per_stage=2)
    actor, a, b = CurriculumActor(cfg), _Gen(), _Gen()
    actor.register("a", a)
    actor.register("b", b)
    actor.tick(1)
    actor.tick(2)
    actor.tick(3)
    assert a.calls == [(2, 0), (4, 1)] and b.calls == [(2, 0), (4, 1)]
    late = _Gen()  # a generator that (re)registers later gets the current horizon at once
    actor.register("a", late)
    assert late.calls == [(4, 1)]
