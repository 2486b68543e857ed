"""`horizonrl` command line: train, eval, demos, status, export-hf, sft | rs | dpo,
make-tiny-model, env-server."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from horizonrl.cluster.config import ConfigError, load_config
from horizonrl.cluster.ops.provenance import command_line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="horizonrl", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run multi-turn RL training")
    t.add_argument("--config", help="YAML run config (default: built-in defaults)")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.lr=1e-4")
    t.add_argument("--resume", metavar="auto|PATH", help="continue from the newest checkpoint "
                   "of this run name and seed (auto), or from a checkpoint or run folder")
    t.add_argument("--dry-run", action="store_true", help="validate the config, print the "
                   "placement plan against the cluster's resources, and exit")
    t.add_argument("--gpu-memory-gib", type=float, help="with --dry-run: GPU memory of the "
                   "nodes the run is for (default: this machine's GPU); checks the memory plan")
    t.add_argument("--resources", metavar="CPU=96,GPU=8", help="with --dry-run: plan against "
                   "this cluster instead of the one the run would get here")
    s = sub.add_parser("status", help="live figures of a running training")
    s.add_argument("target", help="a run folder (reads its status.json) or HOST:PORT of /metrics")
    m = sub.add_parser("make-tiny-model", help="build the offline tiny Qwen2 model + tokenizer")
    m.add_argument("out", help="output folder (save_pretrained format)")
    m.add_argument("--config", help="take env and model.tiny settings from this run config")
    m.add_argument("overrides", nargs="*", help="dotted overrides of the run config")
    for kind, what in (("sft", "supervised fine-tuning on a trajectory log or a JSONL of "
                                "conversations"),
                       ("rs", "rejection-sampling fine-tuning: SFT on the successful episodes"),
                       ("dpo", "DPO on successful vs failed episodes of the same group")):
        a = sub.add_parser(kind, help=what)
        a.add_argument("--data", required=True, help="a run folder, its trajectories/ folder, "
                       "a trajectory .jsonl" + (", or a conversations .jsonl" if kind == "sft"
                                                 else ""))
        a.add_argument("--out", required=True, help="output folder (metrics, model/)")
        a.add_argument("--config", help="run config for the model, learner and seed settings")
        a.add_argument("--model", help="start from this save_pretrained folder (default: the "
                       "config's model)")
        a.add_argument("--steps", type=int, default=20, help="optimizer steps")
        a.add_argument("--batch-size", type=int, default=8, help="examples (pairs) per step")
        a.add_argument("--max-examples", type=int, help="use only the first N examples (pairs)")
        a.add_argument("overrides", nargs="*", help="dotted overrides of the run config")
    d = sub.add_parser("demos", help="expert demonstrations through the agent loop's token "
                       "path, as trajectory JSONL (for sft, dpo and the warm start)")
    d.add_argument("--config", help="run config (env, model for the tokenizer, seed)")
    d.add_argument("--episodes", type=int, help="expert episodes to play (not with --import)")
    d.add_argument("--import", dest="import_file", metavar="FILE", help="convert this file of "
                   "others' trajectories instead of playing the env (needs --format)")
    d.add_argument("--format", choices=["agentgym", "openai"], help="with --import: AgentGym "
                   "(AgentTraj-L JSON/JSONL) or OpenAI chat JSONL (tools, tool_calls, weight)")
    d.add_argument("--out", required=True, help="output folder (demos.jsonl, summary.json)")
    d.add_argument("--split", default="train", choices=["train", "eval"], help="task seeds: "
                   "distinct train-split seeds drawn from the run seed, or the eval split's first")
    d.add_argument("--noise", type=float, default=0.0, help="probability of a random valid "
                   "action in a turn (not learned: response_mask 0); the expert recovers")
    d.add_argument("--thought", default="short", choices=["short", "none"], help="reply "
                   "format: 'Thought: ... Action: ...' or the action line alone")
    d.add_argument("--horizon", "--max-turns", dest="max_turns", type=int, default=30,
                   help="turn cap per episode (--max-turns: its former name)")
    d.add_argument("--model", help="take the tokenizer from this save_pretrained folder "
                   "(default: the config's model)")
    d.add_argument("overrides", nargs="*", help="dotted overrides of the run config")
    v = sub.add_parser("eval", help="accuracy per env, against max turns, and pass@K, with "
                       "plots (eval split, deterministic seeds)")
    who = v.add_mutually_exclusive_group(required=True)
    who.add_argument("--model", help="'base', a run folder (newest checkpoint), a checkpoint "
                     "or a save_pretrained folder")
    who.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two models side by side "
                     "(e.g. base RUN_DIR)")
    v.add_argument("--config", help="run config (model, envs, generator, seed settings)")
    v.add_argument("--envs", help="comma-separated env names (default: the config's envs)")
    v.add_argument("--split", default="eval", choices=["eval", "train-new"], help="task "
                   "split: eval (held-out tasks, seeds from 1,000,000) or train-new (training "
                   "tasks in instances training never draws, seeds from 2,000,000)")
    v.add_argument("--horizons", "--max-turns", dest="max_turns", default="5",
                   help="comma-separated horizons (turn budgets), e.g. 2,4,8 (--max-turns: its "
                   "former name)")
    v.add_argument("--k", default="1", help="comma-separated K for pass@K; max(K) samples are "
                   "drawn per task")
    v.add_argument("--tasks", type=int, default=20, help="eval tasks per env")
    v.add_argument("--out", required=True, help="output folder (results.json, results.md, "
                   "plots)")
    v.add_argument("overrides", nargs="*", help="dotted overrides of the run config")
    x = sub.add_parser("export-hf", help="write a checkpoint as a save_pretrained folder "
                       "(transformers, vLLM) and check it against the learner's logprobs")
    x.add_argument("source", help="a run folder (its newest checkpoint) or a checkpoint folder")
    x.add_argument("out", help="output folder (must be new or empty)")
    e = sub.add_parser("env-server", help="serve an env over the AgentGym HTTP protocol")
    e.add_argument("--env", required=True, help="registered env name, e.g. babyai")
    e.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback "
                   "only; the server has no authentication)")
    e.add_argument("--port", type=int, required=True, help="TCP port (0: any free port; the "
                   "printed URL says which)")
    e.add_argument("--kwargs", default="{}", help='env constructor arguments as a JSON object, '
                   'e.g. \'{"level": "BabyAI-GoToLocal-v0"}\'')
    e.add_argument("--max-envs", type=int, default=256, help="envs open at once; /create "
                   "answers 429 beyond")
    return p


def env_server(args: argparse.Namespace) -> int:
    from horizonrl.envpool.env_server import serve
    from horizonrl.envpool.registry import env_names

    if args.env not in env_names():
        print(f"horizonrl: unknown env {args.env!r}; known: {', '.join(env_names())}",
              file=sys.stderr)
        return 2
    try:
        kwargs = json.loads(args.kwargs)
    except json.JSONDecodeError as exc:
        print(f"horizonrl: --kwargs is not JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(kwargs, dict) or args.max_envs < 1:
        print("horizonrl: --kwargs must be a JSON object and --max-envs >= 1", file=sys.stderr)
        return 2
    try:
        serve(args.env, kwargs, host=args.host, port=args.port, max_envs=args.max_envs)
    except KeyboardInterrupt:
        pass
    except (OSError, ValueError) as exc:  # port taken, env cannot be built
        print(f"horizonrl: env-server: {exc}", file=sys.stderr)
        return 2
    return 0


def demos(args: argparse.Namespace, cfg: Any) -> int:
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.warm_start.demos import collect_demos

    if args.import_file is not None:
        return import_demos(args, cfg)
    if args.episodes is None or args.episodes < 1 or args.max_turns < 1 or not (
            0 <= args.noise < 1):
        print("horizonrl: demos: --episodes (or --import FILE) is required; --episodes and "
              "--horizon must be positive and --noise in [0, 1)", file=sys.stderr)
        return 2
    model = args.model or str(ensure_model(cfg.model, env=cfg.env))
    with ray_session(cfg.ray):
        collect_demos(cfg, model_path=model, episodes=args.episodes, out=args.out,
                      split=args.split, noise=args.noise, thought=args.thought,
                      max_turns=args.max_turns)
    return 0


def import_demos(args: argparse.Namespace, cfg: Any) -> int:
    """`demos --import FILE --format F`: no env is played; 2 when no record was imported."""
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.cluster.warm_start.importers import ImportFailed, import_demos

    if args.format is None:
        print("horizonrl: demos --import needs --format agentgym|openai", file=sys.stderr)
        return 2
    model = args.model or str(ensure_model(cfg.model, env=cfg.env))
    try:
        summary = import_demos(cfg, path=args.import_file, fmt=args.format, model_path=model,
                               out=args.out)
    except ImportFailed as exc:
        print(f"horizonrl: demos --import: {exc}", file=sys.stderr)
        return 2
    if not summary["imported"]:
        print(f"horizonrl: demos --import: none of the {summary['skipped']} records of "
              f"{args.import_file} could be imported (reasons above)", file=sys.stderr)
        return 2
    return 0


def run_eval(args: argparse.Namespace, cfg: Any) -> int:
    from horizonrl.cluster.eval.evaluate import evaluate, resolve_model
    from horizonrl.envpool.config import EnvConfig

    specs = args.compare or [args.model]
    try:
        ks = sorted({int(k) for k in args.k.split(",")})
        turns = sorted({int(h) for h in args.max_turns.split(",")})
        if min(ks) < 1 or min(turns) < 1 or args.tasks < 1:
            raise ValueError("--k, --horizons and --tasks must be positive")
        models = {_label(s, specs): resolve_model(s, cfg) for s in specs}
    except (ValueError, FileNotFoundError) as exc:
        print(f"horizonrl: eval: {exc}", file=sys.stderr)
        return 2
    if len(models) != len(specs):
        print("horizonrl: eval: the two models have the same label", file=sys.stderr)
        return 2
    known = {e.key: e for e in cfg.envs}
    names = args.envs.split(",") if args.envs else list(known)
    envs = [known[n] if n in known else EnvConfig(name=n, kwargs={}) for n in names]
    from horizonrl.cluster.ops.plan import DoesNotFit

    try:
        evaluate(cfg, models, envs=envs, tasks=args.tasks, samples=max(ks), max_turns=turns,
                 out=args.out, split=args.split)
    except DoesNotFit as exc:  # its generator could not be placed
        print(f"horizonrl: eval: {exc}", file=sys.stderr)
        return 2
    # What wrote the report, beside it (results.json stays the numbers alone): `make figures`
    # reruns this command.
    (Path(args.out) / "command.json").write_text(json.dumps(
        {"command": command_line(), "models": models, "split": args.split}, indent=1) + "\n")
    print(f"[horizonrl] eval report in {args.out} (results.md, results.json, command.json, "
          "*.png)")
    return 0


def _label(spec: str, specs: list[str]) -> str:
    """'base' for the base model, 'trained' for the other of a base-vs-X pair, else the name."""
    if spec == "base":
        return "base"
    if "base" in specs:
        return "trained"
    return Path(spec).name


def export(source: str, out: str) -> int:
    from horizonrl.cluster.ops.export import PROBE_TOL, export_hf

    try:
        ckpt, diff = export_hf(source, out)
    except (FileNotFoundError, FileExistsError) as exc:
        print(f"horizonrl: export-hf: {exc}", file=sys.stderr)
        return 2
    print(f"exported {ckpt} -> {out}; transformers vs learner logprobs on the probe: max diff "
          f"{diff:.2e} ({'ok' if diff < PROBE_TOL else 'MISMATCH'})")
    return 0 if diff < PROBE_TOL else 1


def status(target: str) -> int:
    from horizonrl.cluster.ops.prometheus import read_status

    path = Path(target)
    address = (json.loads((path / "status.json").read_text())["metrics_address"]
               if (path / "status.json").exists() else target)
    try:
        v = read_status(address)
    except OSError as exc:
        print(f"horizonrl: no training answers at {address}: {exc}", file=sys.stderr)
        return 1

    def g(name: str) -> float:
        return v.get(f"horizonrl_{name}", float("nan"))

    print(f"step {g('step'):.0f} | horizon {g('horizon'):.0f} | policy_version "
          f"{g('policy_version'):.0f} | success {g('success_rate'):.3f} | turns "
          f"{g('turns_mean'):.2f}\nthroughput {g('tokens_per_second'):.0f} tok/s, "
          f"{g('env_steps_per_second'):.0f} env steps/s | ingest queue "
          f"{g('ingest_queue_depth'):.0f} | staleness {g('staleness_max'):.0f}\n"
          f"pool health: env errors {g('env_errors_total'):.0f}, env restarts "
          f"{g('env_restarts_total'):.0f}, generator restarts "
          f"{g('generator_restarts_total'):.0f}")
    return 0


def _resources(text: str) -> dict[str, float]:
    try:
        return {k.strip(): float(v) for k, v in (x.split("=") for x in text.split(","))}
    except ValueError:
        raise SystemExit(f"horizonrl: --resources {text!r}: expected NAME=NUMBER,... "
                         "(e.g. CPU=96,GPU=8)") from None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "status":
        return status(args.target)
    if args.command == "env-server":
        return env_server(args)
    if args.command == "export-hf":
        return export(args.source, args.out)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"horizonrl: {exc}", file=sys.stderr)
        return 2
    if args.command == "eval":
        return run_eval(args, cfg)
    if args.command == "demos":
        return demos(args, cfg)
    if args.command in ("sft", "rs", "dpo"):
        from horizonrl.cluster.warm_start.auxiliary import run_auxiliary

        try:
            run_auxiliary(args.command, cfg, data=args.data, out=args.out, steps=args.steps,
                          batch_size=args.batch_size, model=args.model,
                          max_examples=args.max_examples)
        except (FileNotFoundError, ValueError) as exc:
            print(f"horizonrl: {args.command}: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "train":
        if args.dry_run:
            from horizonrl.cluster.ops.plan import dry_run

            return dry_run(cfg, gpu_gib=args.gpu_memory_gib,
                           resources=_resources(args.resources) if args.resources else None)
        from horizonrl.cluster.ops.multinode import NotMultiNodeReady
        from horizonrl.cluster.ops.plan import DoesNotFit
        from horizonrl.cluster.train.driver import GeneratorLost, LearnerLost
        from horizonrl.cluster.train.run import train
        from horizonrl.learner.group import PlacementTimeout

        try:
            train(cfg, resume=args.resume)
        except (FileNotFoundError, ConfigError, DoesNotFit, NotMultiNodeReady,
                PlacementTimeout) as exc:
            print(f"horizonrl: {exc}", file=sys.stderr)
            return 2
        except (LearnerLost, GeneratorLost) as exc:
            print(f"horizonrl: {exc}", file=sys.stderr)
            return 3
        except KeyboardInterrupt:
            print("horizonrl: interrupted; continue with `horizonrl train ... --resume auto` "
                  "(from the last checkpoint)", file=sys.stderr)
            return 130
        return 0
    from horizonrl.cluster.model.load import build_from_config

    build_from_config(args.out, cfg.model.tiny, env=cfg.env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
