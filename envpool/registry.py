"""Name -> environment factory, system prompt and action parser.

Each environment's prompt and parsing rule live beside it; the registry only collects them so the
pool, the agent loop and the tiny-model builder agree on them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envpool.base import TextEnv


@dataclass(frozen=True, slots=True)
class EnvSpec:
    """How to build one environment and talk to it."""

    name: str
    factory: Callable[..., TextEnv]
    system_prompt: str
    parse_action: Callable[[str], str]
    format_action: Callable[[str], str]


def _babyai() -> EnvSpec:
    from envpool import babyai

    return EnvSpec("babyai", babyai.BabyAITextEnv, babyai.SYSTEM_PROMPT, babyai.parse_action,
                   babyai.format_action)


_SPECS: dict[str, Callable[[], EnvSpec]] = {"babyai": _babyai}


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
