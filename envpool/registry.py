"""Name -> environment factory, system prompt and action parser.

Each environment's prompt and parsing rule live beside it; the registry only collects them so the
pool, the agent loop and the tiny-model builder agree on them.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from horizonrl.envpool.base import TextEnv


@dataclass(frozen=True, slots=True)
class EnvSpec:
    """How to build one environment and talk to it."""

    name: str
    factory: Callable[..., TextEnv]
    system_prompt: str
    parse_action: Callable[[str], str]
    format_action: Callable[[str], str]
    random_action: Callable[[dict[str, Any], random.Random], str]  # from info alone
    vocabulary: Callable[..., list[str]] | None = None
    """The words of the env's own names for the env's kwargs (Deep Search's made-up entities),
    for a tokenizer that keeps them whole; None where the env has none to list."""
    reward_kwargs: frozenset[str] = frozenset()
    """Kwargs that change only the reward, never an observation (shaping weights, the reward
    mode): the tiny model does not depend on them, so its cache key leaves them out."""


def _from_module(name: str, module: str, factory: str) -> Callable[[], EnvSpec]:
    """A lazy spec: the env's module (and its heavy imports) load only when the env is used.

    Each env module defines `SYSTEM_PROMPT`, `parse_action`, `format_action`, `random_action`
    and the factory, and may define `vocabulary` and `REWARD_KWARGS`.
    """

    def load() -> EnvSpec:
        mod = importlib.import_module(module)
        return EnvSpec(name, getattr(mod, factory), mod.SYSTEM_PROMPT, mod.parse_action,
                       mod.format_action, mod.random_action, getattr(mod, "vocabulary", None),
                       frozenset(getattr(mod, "REWARD_KWARGS", ())))

    return load


_SPECS: dict[str, Callable[[], EnvSpec]] = {
    "babyai": _from_module("babyai", "horizonrl.envpool.babyai", "BabyAITextEnv"),
    "textcraft": _from_module("textcraft", "horizonrl.envpool.textcraft", "TextCraftEnv"),
    "sciworld": _from_module("sciworld", "horizonrl.envpool.sciworld", "SciWorldEnv"),
    # MiniWoB++ web tasks, one headless Chromium per replica (envpool/miniwob.py).
    "miniwob": _from_module("miniwob", "horizonrl.envpool.miniwob", "MiniWoBEnv"),
    "deepsearch": _from_module("deepsearch", "horizonrl.envpool.deepsearch", "DeepSearchEnv"),
    # Fault injection around an env, for chaos tests and drills (envpool/faults.py).
    "faulty": _from_module("faulty", "horizonrl.envpool.faults", "FaultyEnv"),
    # Any AgentGym env server (WebArena, WebShop, SearchQA, or `horizonrl env-server`).
    "agentgym": _from_module("agentgym", "horizonrl.envpool.agentgym_http", "AgentGymHTTPEnv"),
}


def env_names() -> list[str]:
    return sorted(_SPECS)


def env_spec(name: str) -> EnvSpec:
    """The spec registered under `name`; a clear error lists the known names."""
    try:
        return _SPECS[name]()
    except KeyError:
        raise ValueError(f"unknown env {name!r}; known envs: {', '.join(env_names())}") from None


def make_env(name: str, **kwargs: Any) -> TextEnv:
    return env_spec(name).factory(**kwargs)
