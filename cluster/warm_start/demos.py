"""`horizonrl demos`: expert trajectories through the agent loop's own token path.

Each env's scripted expert (`oracle_action()`, run inside the env actors) plays the config's
environment; its action is written as the model would write it ("Thought: ... Action: ..."),
encoded with the chat segments the generator uses, and appended to an `AgentLoop` like a
sampled completion. The result is an ordinary `Trajectory` (exact ids, `response_mask` 1 on the
expert's tokens only) in the JSONL format `save_trajectories=true` writes, so `horizonrl sft`,
`rs`, `dpo` and the warm start read demonstrations and RL rollouts alike.

With `noise` p, a turn takes a random valid action instead (the expert then recovers from the
state it led to); such turns stay in the context but get `response_mask` 0, so the model learns
the recovery, never the random action.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from horizonrl.actors.rollout import AgentLoop, Completion
from horizonrl.cluster.config import RunConfig
from horizonrl.cluster.model.tiny_model import Thought, expert_reply
from horizonrl.envpool.base import EVAL_SEED_OFFSET, split_seeds
from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.pool import EnvPool
from horizonrl.envpool.registry import env_spec
from horizonrl.envpool.replicas import EnvError
from horizonrl.protos.chat import ChatFormat, load_tokenizer
from horizonrl.protos.codec import to_json_line
from horizonrl.protos.trajectory import Failure, Trajectory

DEMOS_FILE = "demos.jsonl"
SUMMARY_FILE = "summary.json"


def demo_seeds(split: str, episodes: int, seed: int | str) -> list[int]:
    """Task seeds: distinct train-split seeds drawn from `seed`, or the first of an evaluation
    split (`envpool.base.split_seeds`)."""
    if split != "train":
        return split_seeds(split, episodes)
    return random.Random(f"demos-{seed}").sample(range(EVAL_SEED_OFFSET), episodes)


@dataclass(slots=True)
class DemoSummary:
    """What a demos run produced (also written as summary.json beside the JSONL); `add` counts
    one more episode in."""

    episodes: int = 0
    successes: int = 0
    turns: int = 0
    tokens: int = 0
    failures: int = 0

    def add(self, t: Trajectory) -> None:
        self.episodes += 1
        self.successes += bool(t.info.get("success"))
        self.turns += t.num_turns
        self.tokens += len(t.prompt_ids) + len(t.response_ids)
        self.failures += t.failure is not Failure.NONE

    @property
    def success_rate(self) -> float:
        return self.successes / max(self.episodes - self.failures, 1)

    @property
    def mean_turns(self) -> float:
        return self.turns / max(self.episodes, 1)

    @property
    def mean_tokens(self) -> float:
        return self.tokens / max(self.episodes, 1)

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "success_rate": self.success_rate,
                "mean_turns": self.mean_turns, "mean_tokens": self.mean_tokens}


class DemoWriter:
    """Plays expert episodes in batches over an env pool (replicas in Ray actors)."""

    def __init__(self, env: EnvConfig, *, chat: ChatFormat, max_turns: int,
                 max_context_tokens: int, noise: float, thought: Thought, seed: int) -> None:
        if not 0.0 <= noise < 1.0:
            raise ValueError(f"noise must be in [0, 1), got {noise}")
        self.env, self.chat, self.spec = env, chat, env_spec(env.name)
        self.max_turns, self.max_context_tokens = max_turns, max_context_tokens
        self.noise, self.thought, self.rng = noise, thought, random.Random(seed)
        self.pool = EnvPool(env, name=f"demos-{env.key}")

    def play(self, seeds: list[int]) -> list[Trajectory]:
        """One expert episode per seed, all stepped together (one pool call per turn)."""
        slots = self.pool.acquire(len(seeds))
        try:
            loops = [self._loop() for _ in seeds]
            infos: list[dict] = [{} for _ in seeds]
            for i, first in enumerate(self.pool.reset(slots, seeds)):
                if isinstance(first, EnvError):
                    loops[i].fail(Failure(first.kind))
                else:
                    loops[i].start(*first)
                    infos[i] = first[1]
            while live := [i for i, loop in enumerate(loops) if not loop.done]:
                experts = self.pool.oracle([slots[i] for i in live])
                actions = []
                for i, expert in zip(live, experts):
                    actions.append(self._turn(loops[i], expert, infos[i]))
                stepped = [i for i, a in zip(live, actions) if a is not None]
                results = self.pool.step([slots[i] for i in stepped],
                                         [a for a in actions if a is not None])
                for i, res in zip(stepped, results):
                    if isinstance(res, EnvError):
                        loops[i].fail(Failure(res.kind))
                    else:
                        loops[i].add_env_result(res)
                        infos[i] = res.info
            return [loop.to_trajectory(
                trajectory_id=f"demo-{self.env.key}-{s}", group_id=f"demo-{self.env.key}-{s}",
                task_id=f"{self.env.key}-{s}", env_name=self.env.key, policy_version=0,
                info={"seed": s, "source": "expert", "noise": self.noise})
                for loop, s in zip(loops, seeds)]
        finally:
            self.pool.release(slots)

    def _loop(self) -> AgentLoop:
        return AgentLoop(chat=self.chat, system_prompt=self.spec.system_prompt,
                         parse_action=self.spec.parse_action, horizon=self.max_turns,
                         max_context_tokens=self.max_context_tokens,
                         max_tokens_per_turn=0)

    def _turn(self, loop: AgentLoop, expert: str | EnvError, info: dict) -> str | None:
        """Append the turn's reply tokens; the action to step, or None if the episode failed."""
        if isinstance(expert, EnvError):
            loop.fail(Failure(expert.kind))
            return None
        action, trainable = expert, True
        if self.noise and info.get("available_actions") and self.rng.random() < self.noise:
            action, trainable = self.spec.random_action(info, self.rng), False
        ids = tuple(self.chat.assistant_ids(expert_reply(self.spec, action, self.thought)))
        return loop.add_model_turn(Completion(ids, (0.0,) * len(ids), "stop"),
                                   trainable=trainable)


def _shares(envs: list[EnvConfig], episodes: int) -> list[int]:
    """Episodes per env in proportion to env.weight (largest remainders get the rest)."""
    total = sum(e.weight for e in envs)
    raw = [episodes * e.weight / total for e in envs]
    shares = [int(r) for r in raw]
    for i in sorted(range(len(envs)), key=lambda i: shares[i] - raw[i])[:episodes - sum(shares)]:
        shares[i] += 1
    return shares


def collect_demos(cfg: RunConfig, *, model_path: str, episodes: int, out: str | Path,
                  split: str = "train", noise: float = 0.0, thought: Thought = "short",
                  max_turns: int = 30, batch: int | None = None) -> DemoSummary:
    """Write `episodes` expert trajectories to OUT/demos.jsonl (+ summary.json), shared among
    the run's envs by their weights.

    Needs a Ray session (the env pools' actors). Prints a progress line per batch and the
    expert's success rate and mean turns (per env, and over all) at the end.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chat = ChatFormat(load_tokenizer(model_path))
    t0 = time.perf_counter()
    per_env: dict[str, DemoSummary] = {}
    with (out / DEMOS_FILE).open("w") as f:
        for env, n in zip(cfg.envs, _shares(cfg.envs, episodes)):
            if n == 0:
                continue
            writer = DemoWriter(env, chat=chat, max_turns=max_turns,
                                max_context_tokens=cfg.generator.max_context_tokens,
                                noise=noise, thought=thought, seed=cfg.seed)
            # Each env of a mixed run draws its own task seeds.
            seeds = demo_seeds(split, n, cfg.seed if len(cfg.envs) == 1
                               else f"{cfg.seed}-{env.key}")
            tally = per_env[env.key] = DemoSummary()
            step = batch or env.num_actors * env.replicas_per_actor
            for start in range(0, len(seeds), step):
                for t in writer.play(seeds[start:start + step]):
                    f.write(to_json_line(t) + "\n")
                    tally.add(t)
                print(f"[demos] {env.key}: {tally.episodes}/{n} episodes | expert success "
                      f"{tally.success_rate:.3f} | turns {tally.mean_turns:.2f} | "
                      f"{time.perf_counter() - t0:.0f}s", flush=True)
    total = DemoSummary(*(sum(getattr(v, k) for v in per_env.values())
                          for k in ("episodes", "successes", "turns", "tokens", "failures")))
    (out / SUMMARY_FILE).write_text(json.dumps(
        {**total.as_dict(), "seconds": round(time.perf_counter() - t0, 1), "split": split,
         "noise": noise, "thought": thought, "max_turns": max_turns, "env": "+".join(per_env),
         "per_env": {k: v.as_dict() for k, v in per_env.items()}}, indent=2))
    for key, v in per_env.items():
        print(f"[demos] expert on {key} ({split}): success {v.success_rate:.3f}, mean turns "
              f"{v.mean_turns:.2f}, {v.failures} infra failures", flush=True)
    print(f"[demos] wrote {total.episodes} episodes to {out / DEMOS_FILE}", flush=True)
    return total
