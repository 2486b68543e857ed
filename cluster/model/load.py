"""Resolve the starting checkpoint: a user's path, or the tiny model built once and cached."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from horizonrl.cluster.config import ConfigError, ModelConfig, TinyModelConfig
from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.registry import env_spec


def model_kwargs(env: EnvConfig) -> dict:
    """The env kwargs that shape the tiny model: all but those that change only the reward
    (`EnvSpec.reward_kwargs`), so a run with shaping on reuses the model built without it."""
    reward_only = env_spec(env.name).reward_kwargs
    return {k: v for k, v in env.kwargs.items() if k not in reward_only}


def tiny_model_dir(cfg: ModelConfig, env: EnvConfig) -> Path:
    """Cache folder keyed by everything that shapes the tiny model."""
    tiny = cfg.tiny.model_dump()
    if not tiny["names"]:  # a field added later counts only when set: older caches stay valid
        del tiny["names"]
    tiny["max_turns"] = tiny.pop("horizon")  # its former name: caches built before stay valid
    key = json.dumps({"tiny": tiny, "env": env.name, "kwargs": model_kwargs(env)},
                     sort_keys=True)
    return Path(cfg.cache_dir) / f"tiny-{env.name}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def ensure_model(cfg: ModelConfig, *, env: EnvConfig) -> Path:
    """The checkpoint folder to load; builds the tiny model on first use (never downloads)."""
    if cfg.path is not None:
        path = Path(cfg.path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"model.path {path} is not a save_pretrained folder "
                                    f"(no config.json); horizonrl never downloads models")
        return path
    out = tiny_model_dir(cfg, env)

    def build(tmp: Path) -> None:
        print(f"[horizonrl] building the tiny model into {out} (its first use with this "
              "config: minutes on a CPU; later runs reuse it)", flush=True)
        build_from_config(tmp, cfg.tiny, env=env)

    return built_once(out, build)


def built_once(out: Path, build: Callable[[Path], object]) -> Path:
    """`out`, built by `build(tmp)` unless a finished build is there. Two processes that need
    the same model at once (two runs, two test workers) build it once: the second waits on a
    lock file beside it, then finds the first one's build. Only a finished build is ever
    found: it is written to a temporary folder and renamed."""
    import fcntl
    import shutil

    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if (out / "config.json").exists():
            return out
        tmp = out.with_name(out.name + ".building")
        shutil.rmtree(tmp, ignore_errors=True)  # a build killed half-way
        build(tmp)
        tmp.rename(out)
    return out


def check_context(path: Path, max_context_tokens: int) -> None:
    """Fail at start, not when the generators load the model after a warm start: the context a
    run asks for must fit the model's positions."""
    positions = json.loads((path / "config.json").read_text()).get("max_position_embeddings")
    if positions is not None and max_context_tokens > positions:
        raise ConfigError(f"generator.max_context_tokens ({max_context_tokens}) exceeds "
                         f"max_position_embeddings ({positions}) of the model at {path}")


def build_from_config(out: str | Path, tiny: TinyModelConfig, *, env: EnvConfig) -> Path:
    """`horizonrl make-tiny-model` and the cache above: the tiny model as `tiny` describes it."""
    from horizonrl.cluster.model.tiny_model import build_tiny_model

    return build_tiny_model(out, env_name=env.name, env_kwargs=model_kwargs(env),
                            **tiny.model_dump())
