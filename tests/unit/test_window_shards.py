"""Window-context rows across ranks and minibatches: with a window at least the horizon, every
episode weighs in every optimizer step what it weighs in full-context mode.

No Ray: `LearnerGroup.train` runs in-process over real `LearnerWorker`s whose DeepSpeed engine
is a stand-in that records each optimizer step's gradient; DeepSpeed averages the ranks'
gradients, so the test does too. Two ways to read the gradient:
- the per-token loss of episode e is a parameter x[e], so d(step loss)/dx[e] is e's weight;
- the real policy objective on a causal toy model (logits from the current token only, so a
  turn's row scores its tokens as the whole episode's row does).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from horizonrl.learner import algorithms as alg
from horizonrl.learner import worker as worker_module
from horizonrl.learner.config import LearnerConfig
from horizonrl.learner.group import LearnerGroup
from horizonrl.learner.worker import LearnerWorker
from horizonrl.protos.trajectory import Trajectory

AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
RTOL = 1e-6  # the learner's row_share, row_scale and 1 / tokens are float32
PROMPT, REPLY, OBS = 4, 3, 2  # tokens: the task, each turn's reply (all trained), each answer
VOCAB = 50


def _episode(k: int, turns: int, *, window: bool, reward: float) -> Trajectory:
    """`turns` turns of REPLY model tokens, each answered by OBS env tokens; in window mode with
    spans whose window starts at 0 (a window at least the horizon: the whole history)."""
    rng = random.Random(k)
    resp, mask, spans = [], [], []
    for _ in range(turns):
        start = len(resp)
        resp += [rng.randrange(1, VOCAB) for _ in range(REPLY + OBS)]
        mask += [1] * REPLY + [0] * OBS
        spans.append((0, start, start + REPLY))
    return Trajectory(
        trajectory_id=f"e{k}", group_id="g", task_id="t", env_name="toy", policy_version=0,
        horizon=8, prompt_ids=tuple(rng.randrange(1, VOCAB) for _ in range(PROMPT)),
        response_ids=tuple(resp), response_mask=tuple(mask),
        response_logprobs=tuple(-2.0 - 0.1 * (i % 3) if m else 0.0 for i, m in enumerate(mask)),
        rewards=(0.0,) * (turns - 1) + (reward,), reward=reward, num_turns=turns,
        terminated=True, truncated=False, turn_spans=tuple(spans) if window else ())


def _episodes(turns: list[int], *, window: bool) -> list[Trajectory]:
    return [_episode(k, n, window=window, reward=float(k % 2)) for k, n in enumerate(turns)]


class RecordingEngine:
    """Stands in for a rank's DeepSpeed engine: `backward` accumulates into the parameters'
    gradients, `step` records them (one flat float64 vector) and clears them."""

    device = torch.device("cpu")

    def __init__(self, params: list[torch.Tensor], forward) -> None:
        self.params, self.forward, self.steps = params, forward, []

    def __call__(self, *, input_ids: torch.Tensor, **_: object) -> SimpleNamespace:
        return SimpleNamespace(logits=self.forward(input_ids))

    def train(self) -> None:
        pass

    def eval(self) -> None:
        pass

    def set_gradient_accumulation_boundary(self, _last: bool) -> None:
        pass

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.steps.append(torch.cat([p.grad.double().flatten() for p in self.params]).numpy())
        for p in self.params:
            p.grad = None

    def get_global_grad_norm(self) -> float:
        return 0.0

    def get_lr(self) -> list[float]:
        return [0.0]


class _InProcess:
    """A LearnerWorker called as `.method.remote(...)`, the way LearnerGroup calls its actors."""

    def __init__(self, worker: LearnerWorker) -> None:
        self.worker = worker

    def __getattr__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(remote=getattr(self.worker, name))


def _train(monkeypatch, trajs, cfg, engines, advantages=None) -> tuple[list[np.ndarray], dict]:
    """One `LearnerGroup.train` on `cfg.world_size` in-process ranks; the gradient of every
    optimizer step as DeepSpeed applies it (the ranks' mean), and the group's stats."""
    import ray

    monkeypatch.setattr(ray, "get", lambda refs, **_: refs)
    group = LearnerGroup.__new__(LearnerGroup)
    group.cfg, group.pad_id = cfg, 0
    workers = []
    for rank, engine in enumerate(engines):
        w = LearnerWorker(rank=rank, world_size=cfg.world_size, cfg=cfg, model_path="-", seed=0)
        w.engine, w.ref, w.critic = engine, None, None
        workers.append(_InProcess(w))
    group.workers = workers
    if advantages is not None:
        from horizonrl.learner.credit import outcome

        monkeypatch.setattr(outcome.GRPO, "episode_advantages",
                            lambda _self, _trajs: np.asarray(advantages, dtype=np.float32))
    stats = group.train(trajs)
    steps = [np.mean(per_rank, axis=0) for per_rank in zip(*(e.steps for e in engines))]
    return steps, stats


def _episode_weights(monkeypatch, trajs, cfg) -> np.ndarray:
    """[steps, episodes]: what each episode's loss weighs in each optimizer step."""
    x = torch.ones(len(trajs), dtype=torch.float64, requires_grad=True)

    def by_episode(logp, entropy, t, cfg, *, ref_logprobs):
        # Advantage e + 1 marks episode e, whose every token's loss is x[e].
        idx = (t["advantages"].round().long() - 1).clamp_min(0)
        return alg.aggregate(x[idx], t["loss_mask"], cfg.loss_agg, row_scale=t.get("row_scale"),
                             row_share=t.get("row_share")), {}

    monkeypatch.setattr(worker_module, "policy_loss", by_episode)
    engines = [RecordingEngine([x], lambda ids: torch.zeros(*ids.shape, VOCAB))
               for _ in range(cfg.world_size)]
    steps, stats = _train(monkeypatch, trajs, cfg, engines,
                          advantages=np.arange(1, len(trajs) + 1))
    assert stats["skipped_update"] == 0.0
    return np.stack(steps)


def _cfg(agg: str, **kw) -> LearnerConfig:
    # The defaults under test: 2 ranks, 2 minibatches, one epoch. Rows bucketed by length and
    # dealt to ranks by tokens (the weights do not depend on the layout; the stand-in engine
    # has no KV cache for the shared prefix, whose equivalence test_layouts.py checks).
    return LearnerConfig(loss_agg=agg, kl_coef=0.0, skip_zero_variance_groups=False,
                         **{"layout": "bucketed", **kw})


@pytest.mark.parametrize("agg", AGGS)
def test_window_rows_weigh_each_episode_as_full_mode(monkeypatch, agg):
    """One 6-turn and three 2-turn episodes on 2 ranks x 2 minibatches (issue 41, defect 8)."""
    turns = [6, 2, 2, 2]
    full = _episode_weights(monkeypatch, _episodes(turns, window=False), _cfg(agg))
    window = _episode_weights(monkeypatch, _episodes(turns, window=True), _cfg(agg))
    print(f"\n{agg}: full {full.round(4).tolist()}\n{' ' * len(agg)}  window "
          f"{window.round(4).tolist()}")
    np.testing.assert_allclose(window, full, rtol=RTOL, atol=1e-12)
    # Token-budget micro-batches (a few rows each) only regroup the same sums.
    micro = _episode_weights(monkeypatch, _episodes(turns, window=True),
                             _cfg(agg, micro_batch_tokens=40))
    np.testing.assert_allclose(micro, full, rtol=RTOL, atol=1e-12)
    padded = _episode_weights(monkeypatch, _episodes(turns, window=True),
                              _cfg(agg, layout="padded", micro_batch_tokens=40))
    np.testing.assert_allclose(padded, full, rtol=RTOL, atol=1e-12)
    # By hand: full mode deals rows [e0 e1 | e2 e3] to the ranks and each rank's rows to its
    # two minibatches, so step 1 trains e0 and e2, step 2 e1 and e3, each as one global mean.
    n = np.array([6, 2, 2, 2]) * REPLY  # model tokens per episode
    pairs = [(0, 2), (1, 3)]
    want = np.zeros((2, 4))
    for s, pair in enumerate(pairs):
        for e in pair:
            want[s, e] = {"token-mean": n[e] / n[list(pair)].sum(),
                          "seq-mean-token-mean": 1 / 2,
                          "seq-mean-token-sum": n[e] / 2}[agg]
    np.testing.assert_allclose(full, want, rtol=RTOL)


@pytest.mark.parametrize("agg", AGGS)
def test_uneven_ranks_do_not_change_the_weights(monkeypatch, agg):
    """5 equal episodes on 2 ranks (3 + 2 rows), one minibatch: every episode weighs 1/5 of
    the mean, not 1/6 on one rank and 1/4 on the other."""
    weights = _episode_weights(monkeypatch, _episodes([2] * 5, window=False),
                               _cfg(agg, minibatches=1))
    per_episode = {"seq-mean-token-sum": 2 * REPLY / 5}.get(agg, 1 / 5)
    np.testing.assert_allclose(weights, [[per_episode] * 5], rtol=RTOL)


@pytest.mark.parametrize("agg", AGGS)
def test_window_rows_give_the_full_mode_gradient(monkeypatch, agg):
    """The real policy objective (clipped surrogate, GRPO advantages) through LearnerWorker's
    micro-batch weighting: every optimizer step's gradient equals full mode's."""

    def run(window: bool) -> tuple[list[np.ndarray], dict]:
        torch.manual_seed(0)
        table = torch.nn.Embedding(VOCAB, VOCAB)  # logits of the next token from this one only
        engines = [RecordingEngine(list(table.parameters()), table)
                   for _ in range(2)]
        return _train(monkeypatch, _episodes([6, 2, 2, 2], window=window), _cfg(agg), engines)

    (full, full_stats), (window, window_stats) = run(False), run(True)
    assert len(full) == len(window) == 2
    for f, w in zip(full, window):
        assert np.abs(f).max() > 1e-3
        np.testing.assert_allclose(w, f, rtol=1e-5, atol=1e-8)
    assert window_stats["loss"] == pytest.approx(full_stats["loss"], rel=1e-5, abs=1e-8)


def test_an_update_needs_as_many_episodes_as_full_mode(monkeypatch):
    """Minibatches are made of episodes: 3 episodes (10 turn rows) cannot fill 2 ranks x 2
    minibatches in either mode."""
    for window in (False, True):
        trajs = _episodes([6, 2, 2], window=window)
        group = LearnerGroup.__new__(LearnerGroup)
        group.cfg, group.pad_id, group.workers = _cfg("token-mean"), 0, []
        assert group.train(trajs)["skipped_update"] == 1.0
        assert group.fates(trajs) == {"update_skipped": [0, 1, 2]}
