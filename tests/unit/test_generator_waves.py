"""How a rollout's tasks are split into waves that fit each env pool (no Ray: the pools are
stand-ins with a capacity; the real rollout in waves is in
tests/integration/test_curriculum_broadcast.py)."""

from types import SimpleNamespace

import pytest

from horizonrl.actors.generator import GeneratorActor, Task


def _gen(**capacity):
    pools = {k: SimpleNamespace(capacity=c) for k, c in capacity.items()}
    return SimpleNamespace(pools=pools, default_env="a", name="gen0")


def _tasks(envs):
    return [Task(task_id=f"{e}-{i}", seed=i, env=e) for i, e in enumerate(envs)]


def test_everything_fitting_is_one_wave_in_order():
    tasks = _tasks("abab")
    assert GeneratorActor._waves(_gen(a=8, b=4), tasks, 2) == [tasks]


def test_waves_fill_each_pool_and_keep_every_task_once():
    tasks = _tasks("aaaaab")
    waves = GeneratorActor._waves(_gen(a=4, b=4), tasks, 2)
    assert sorted(t.task_id for w in waves for t in w) == sorted(t.task_id for t in tasks)
    for w in waves:
        for env, cap in (("a", 4), ("b", 4)):
            assert 2 * sum(t.env == env for t in w) <= cap
    assert len(waves) == 3


def test_a_group_larger_than_its_pool_is_a_clear_error():
    with pytest.raises(ValueError, match="group of 8 episodes needs that many a replicas"):
        GeneratorActor._waves(_gen(a=4), _tasks("a"), 8)
