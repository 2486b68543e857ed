"""`horizonrl train`: the whole run, fresh or resumed, with one progress line per iteration."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from horizonrl.cluster.config import RunConfig
from horizonrl.cluster.model.load import check_context, ensure_model
from horizonrl.cluster.ops.checkpoints import find_checkpoint, load_resume, truncate_metrics
from horizonrl.cluster.ops.multinode import check_multinode
from horizonrl.cluster.ops.plan import wait_until_fits
from horizonrl.cluster.rollout.fleet import GeneratorLost
from horizonrl.cluster.rollout.iteration import make_run_dir
from horizonrl.cluster.train.driver import Trainer
from horizonrl.cluster.train.metrics import ProgressReporter


def train(cfg: RunConfig, *, resume: str | None = None) -> Path:
    """Run `cfg.iterations` iterations in total (a resumed run does the rest); returns the
    run directory."""
    from horizonrl.cluster.ops.runtime import link_worker_logs, ray_session

    with ray_session(cfg.ray):
        # Before a run dir exists (a run that cannot start leaves none) and before a first-use
        # model build: a run the cluster cannot hold says so in seconds, not after minutes of
        # building (an idle Ray beside the build costs little).
        wait_until_fits(cfg)
        base = ensure_model(cfg.model, env=cfg.env)
        check_context(base, cfg.generator.max_context_tokens)
        t0 = time.perf_counter()
        check_multinode(cfg, model_dir=base)  # several nodes: reachable ingest, shared paths
        run_dir, state = _open_run(cfg, resume)
        if not cfg.ray.log_to_driver and (logs := link_worker_logs(run_dir)) is not None:
            print(f"[horizonrl] actor output (vLLM, DeepSpeed, envs): {logs} (run_dir/ray-logs)",
                  flush=True)
        if state is None and cfg.init.sft_epochs > 0:
            from horizonrl.cluster.warm_start.recipe import run_warm_start

            # RL starts from the cloned model, and it is also the KL reference from then on.
            cloned = run_warm_start(cfg, run_dir=run_dir, base_model=str(base))
            cfg = cfg.model_copy(update={"model": cfg.model.model_copy(
                update={"path": str(cloned)})})
        _rl(cfg, run_dir=run_dir, state=state, t0=t0)
    return run_dir


def _open_run(cfg: RunConfig, resume: str | None) -> tuple[Path, object]:
    """The run dir and the resume state (None for a fresh run or an unfinished warm start)."""
    ckpt = (find_checkpoint(resume, run_root=cfg.run_root, name=cfg.name, seed=cfg.seed)
            if resume else None)
    state = load_resume(ckpt) if ckpt else None
    if state is not None:
        truncate_metrics(state.run_dir, state.step)
        print(f"[horizonrl] resuming {state.run_dir} from {ckpt.name} (step {state.step}, "
              f"policy_version {state.policy_version})", flush=True)
        return state.run_dir, state
    if resume and (run_dir := _unfinished_warm_start(cfg)) is not None:
        print(f"[horizonrl] resuming the warm start of {run_dir}", flush=True)
        return run_dir, None
    if resume:
        print(f"[horizonrl] --resume {resume}: no checkpoint yet, starting fresh", flush=True)
    run_dir = make_run_dir(cfg)
    print(f"[horizonrl] run dir {run_dir}", flush=True)
    return run_dir, None


def _unfinished_warm_start(cfg: RunConfig) -> Path | None:
    """The newest run of this name and seed that began a warm start and has no checkpoint."""
    from horizonrl.cluster.warm_start.recipe import INIT_DIR

    for run in sorted(Path(cfg.run_root).glob(f"{cfg.name}__{cfg.seed}__*"), reverse=True):
        if (run / INIT_DIR).is_dir():
            return run
    return None


def _rl(cfg: RunConfig, *, run_dir: Path, state: object, t0: float) -> None:
    """The RL phase: iterations with progress, periodic and final checkpoints."""
    with Trainer(cfg, run_dir=run_dir, resume=state) as trainer:
        print(f"[horizonrl] actors ready in {time.perf_counter() - t0:.0f}s (learner "
              f"{trainer.precision['learner']}, vLLM {trainer.precision['generator']}); training "
              f"to {cfg.iterations} iterations", flush=True)
        progress = ProgressReporter(total=cfg.iterations, done=trainer.step_count)
        stop = StopRequest()
        try:
            while trainer.step_count < cfg.iterations and not stop.requested:
                try:
                    m = trainer.step()
                except GeneratorLost as exc:  # the learner is fine: keep what it has learned
                    saved = trainer.save_checkpoint()
                    raise GeneratorLost(f"{exc} (checkpoint {saved})") from None
                progress.update(m)
                if m["horizon"] != m["next_horizon"]:
                    why = m.get("curriculum_decision")
                    print(f"[horizonrl] horizon {m['horizon']} -> {m['next_horizon']}"
                          f"{': ' + why if why else ''}", flush=True)
                evals = {k: v for k, v in m.items() if k.startswith("eval/")}
                if evals:
                    print("[horizonrl] eval after step {}: {}".format(trainer.step_count, ", ".join(
                        f"{k[5:]} {v:.3f}" for k, v in evals.items() if "accuracy" in k)),
                        flush=True)
                every = cfg.checkpoint_every
                if every and trainer.step_count % every == 0 \
                        and trainer.step_count < cfg.iterations:
                    trainer.save_checkpoint()
        finally:
            progress.close()
            stop.restore()
        final = trainer.save_checkpoint() if state is None or trainer.step_count > state.step \
            else state.checkpoint
        what = f"stopped by {stop.requested} after step" if stop.requested else "done at step"
        print(f"[horizonrl] {what} {trainer.step_count} in {time.perf_counter() - t0:.0f}s; "
              f"final checkpoint {final}", flush=True)


class StopRequest:
    """SIGINT or SIGTERM (Ctrl-C, `kill`, a Kubernetes pod's termination notice) asks the run
    to stop after the current iteration, with a checkpoint and the ledger closed; a second
    SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._old = {sig: signal.signal(sig, self._handle)
                     for sig in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        print(f"[horizonrl] {self.requested}: stopping after this iteration (checkpoint "
              "first); SIGINT again to stop now", flush=True)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
