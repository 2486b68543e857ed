"""ScalingInter-RL schedule: step -> horizon at and around stage boundaries, and how the
horizon reaches generators (at registration, then with each rollout call)."""

import threading
import time

import pytest
from pydantic import ValidationError

from horizonrl.actors.config import CurriculumConfig
from horizonrl.actors.curriculum import (
    CurriculumActor,
    HorizonSetting,
    env_horizons_at,
    env_weights_at,
    horizon_at,
    stage_at,
)

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


def test_register_sends_the_horizon_and_changes_travel_with_rollouts():
    cfg = CurriculumConfig(horizons=[2, 4], steps_per_stage=2)
    actor, a, b = CurriculumActor(cfg), _Gen(), _Gen()
    actor.register("a", a)
    actor.register("b", b)
    settings = []
    for s in (1, 2, 3):
        actor.tick(s)
        settings.append(actor.setting())
    # A tick never calls a generator: its next rollout call carries the setting.
    assert a.calls == [(2, 0)] and b.calls == [(2, 0)]
    assert [(x.horizon, x.version) for x in settings] == [(2, 0), (4, 1), (4, 1)]
    assert settings[-1] == HorizonSetting(4, 1, {})
    late = _Gen()  # a generator that (re)registers later gets the current horizon at once
    actor.register("a", late)
    assert late.calls == [(4, 1)]


@pytest.mark.parametrize("resume_at", [99, 100, 101])
def test_resume_before_at_after_boundary_continues_like_uninterrupted(resume_at):
    straight = CurriculumActor(CFG)
    for s in range(1, resume_at + 1):
        straight.tick(s)
    resumed = CurriculumActor(CFG)
    resumed.set_state(straight.get_state())
    for s in range(resume_at + 1, resume_at + 150):
        assert resumed.tick(s) == straight.tick(s), f"diverged at step {s}"


def test_explicit_boundaries_every_step():
    cfg = CurriculumConfig(horizons=[5, 8, 10], boundaries=[3, 7])
    assert [horizon_at(cfg, s) for s in range(9)] == [5, 5, 5, 8, 8, 8, 8, 10, 10]
    with pytest.raises(ValidationError, match="boundaries"):
        CurriculumConfig(horizons=[5, 8, 10], boundaries=[7, 3])


ADAPT = CurriculumConfig(schedule="adaptive", horizons=[4, 8], window=4,
                         truncation_threshold=0.5, min_improvement=0.02, horizon_step=2)


def _decide(window, horizon=4, cfg=ADAPT):
    from horizonrl.actors.curriculum import adaptive_decision

    return adaptive_decision(cfg, step=10, horizon=horizon, window=window)


def test_adaptive_raises_when_truncated_and_stalled():
    d = _decide([(0.3, 0.7), (0.31, 0.6), (0.3, 0.65), (0.3, 0.7)])
    assert (d.before, d.after) == (4, 6) and d.reason.startswith("raise")


def test_adaptive_holds_while_improving_or_rarely_truncated_or_short_window():
    assert _decide([(0.1, 0.7), (0.2, 0.7), (0.4, 0.7), (0.5, 0.7)]).after == 4  # improving
    assert _decide([(0.3, 0.1), (0.3, 0.1), (0.3, 0.1), (0.3, 0.1)]).after == 4  # not truncated
    assert _decide([(0.3, 0.9)] * 3).reason.startswith("hold: 3/4")


def test_adaptive_respects_bounds_and_lowers_only_if_allowed():
    stalled = [(0.3, 0.9)] * 4
    d = _decide(stalled, horizon=8)
    assert d.after == 8 and "maximum" in d.reason
    idle = [(0.9, 0.0)] * 4
    assert _decide(idle, horizon=8).after == 8
    lowering = ADAPT.model_copy(update={"allow_lower": True})
    assert _decide(idle, horizon=8, cfg=lowering).after == 6
    assert _decide(idle, horizon=4, cfg=lowering).after == 4  # never below horizons[0]


def test_adaptive_actor_raises_and_restores_window():
    actor, gen = CurriculumActor(ADAPT), _Gen()
    actor.register("g", gen)
    for s in range(1, 5):
        actor.tick(s, {"success_rate": 0.3, "truncated_at_horizon_rate": 0.8})
    assert gen.calls == [(4, 0)] and actor.setting() == HorizonSetting(6, 1, {})
    assert actor.window == []  # statistics restart after a change
    actor.tick(5, {"success_rate": 0.5, "truncated_at_horizon_rate": 0.2})
    restored = CurriculumActor(ADAPT)
    restored.set_state(actor.get_state())
    assert restored.get_state() == actor.get_state() and restored.current() == (6, 1)


class _EnvGen:
    def __init__(self):
        self.calls = []

    def set_horizon(self, h, v, env_horizons=None):
        self.calls.append((h, v, env_horizons))


def test_per_env_horizons_follow_the_stages_and_travel_with_the_horizon():
    cfg = CurriculumConfig(horizons=[4, 8, 12], steps_per_stage=2,
                           env_horizons={"textcraft": [10, 20, 30]})
    assert [stage_at(cfg, s) for s in range(7)] == [0, 0, 1, 1, 2, 2, 2]
    assert env_horizons_at(cfg, 3) == {"textcraft": 20}
    actor, gen = CurriculumActor(cfg), _EnvGen()
    actor.register("g", gen)
    assert gen.calls == [(4, 0, {"textcraft": 10})]
    settings = []
    for s in range(1, 5):
        actor.tick(s)
        settings.append(actor.setting())
    assert settings == [HorizonSetting(4, 0, {"textcraft": 10}),
                        HorizonSetting(8, 1, {"textcraft": 20}),
                        HorizonSetting(8, 1, {"textcraft": 20}),
                        HorizonSetting(12, 2, {"textcraft": 30})]
    resumed = CurriculumActor(cfg)
    resumed.set_state(actor.get_state())
    assert resumed.current_env_horizons() == {"textcraft": 30}


def test_per_env_tables_are_validated():
    with pytest.raises(ValidationError, match="adaptive"):
        CurriculumConfig(schedule="adaptive", horizons=[4, 8], env_horizons={"a": [3]})
    with pytest.raises(ValidationError, match=r"one horizon >= 1 per stage \(3\)"):
        CurriculumConfig(horizons=[4, 8, 12], env_horizons={"a": [3, 5]})
    with pytest.raises(ValidationError, match=r"one weight >= 0 per stage \(1\)"):
        CurriculumConfig(schedule="fixed", horizons=[4], env_weights={"a": [1.0, 2.0]})
    assert env_weights_at(CurriculumConfig(horizons=[2, 4], steps_per_stage=5,
                                           env_weights={"a": [1.0, 0.0]}), 7) == {"a": 0.0}


class _BusyGen:
    """A generator that serves one call at a time, as a Ray actor does: `set_horizon` waits
    for the rollout in progress. Records the horizon each rollout ran with."""

    def __init__(self):
        self.turn = threading.Lock()
        self.horizon, self.version, self.used = None, -1, []

    def set_horizon(self, h, v, env_horizons=None):
        with self.turn:
            if v >= self.version:
                self.horizon, self.version = h, v

    def rollout(self, *, seconds, setting=None, started=None):
        with self.turn:
            if started is not None:
                started.set()
            time.sleep(seconds)
            # What GeneratorActor.rollout does with the horizon its call carries.
            if setting is not None and setting.version >= self.version:
                self.horizon, self.version = setting.horizon, setting.version
            self.used.append(self.horizon)


def test_tick_never_waits_on_a_generator_busy_with_a_rollout():
    """Async mode (issue 41, defect 10): a horizon change mid-rollout must not stall the
    driver for the rest of that rollout; the next rollout call carries the new horizon."""
    cfg = CurriculumConfig(horizons=[2, 4], boundaries=[1])
    actor, gen = CurriculumActor(cfg), _BusyGen()
    actor.register("g", gen)
    started = threading.Event()
    busy = threading.Thread(target=gen.rollout, kwargs={"seconds": 1.0, "started": started})
    busy.start()
    try:
        assert started.wait(5)
        t0 = time.monotonic()
        assert actor.tick(1) == (4, 1)
        waited = time.monotonic() - t0
    finally:
        busy.join(10)
    assert waited < 0.25, f"tick waited {waited:.2f}s on the rollout in progress"
    gen.rollout(seconds=0.0, setting=actor.setting())
    assert gen.used == [2, 4]  # the rollout in progress kept its horizon; the next has the new
