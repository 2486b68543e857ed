"""The tiny model's cache key: reward-only env kwargs (shaping) do not build a second model."""

import inspect

import pytest

from horizonrl.cluster.config import ModelConfig
from horizonrl.cluster.model.load import model_kwargs, tiny_model_dir
from horizonrl.cluster.model.tiny_model import random_transcripts
from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.registry import env_names, env_spec


def test_shaping_kwargs_reuse_the_model_that_other_kwargs_do_not():
    plain = EnvConfig(name="textcraft", kwargs={"depths": [2]})
    shaped = EnvConfig(name="textcraft", kwargs={"depths": [2], "invalid_penalty": 0.05,
                                                 "subgoal_reward": 0.1})
    deeper = EnvConfig(name="textcraft", kwargs={"depths": [3], "invalid_penalty": 0.05})
    model = ModelConfig()
    assert tiny_model_dir(model, shaped) == tiny_model_dir(model, plain)
    assert tiny_model_dir(model, deeper) != tiny_model_dir(model, plain)
    assert model_kwargs(shaped) == {"depths": [2]}


@pytest.mark.parametrize("name", env_names())
def test_every_reward_only_kwarg_is_a_parameter_of_its_env(name):
    """A misspelt name in an env's REWARD_KWARGS would silently key nothing out."""
    spec = env_spec(name)
    params = inspect.signature(spec.factory).parameters
    assert spec.reward_kwargs <= set(params), spec.reward_kwargs - set(params)


@pytest.mark.parametrize(("name", "kwargs", "shaping"), [
    ("textcraft", {"depths": [1, 2]}, {"invalid_penalty": 0.5, "subgoal_reward": 0.3}),
    ("babyai", {"level": "BabyAI-GoToLocal-v0"}, {"invalid_penalty": 0.5, "reward": "scaled"}),
])
def test_reward_only_kwargs_leave_the_models_transcripts_unchanged(name, kwargs, shaping):
    """What the key leaves out must not reach what the model is built from: the random
    policy's transcripts (observations and replies) are the same with shaping on."""
    assert set(shaping) == env_spec(name).reward_kwargs
    plain = random_transcripts(env_name=name, env_kwargs=kwargs, episodes=12, max_turns=8, seed=3)
    shaped = random_transcripts(env_name=name, env_kwargs={**kwargs, **shaping}, episodes=12,
                                max_turns=8, seed=3)
    assert shaped == plain
    assert sum(len(m) for m in plain) > 12 * 3  # episodes of several turns were compared
