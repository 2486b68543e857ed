"""`horizonrl` command line: train, make-tiny-model."""

from __future__ import annotations

import argparse
import sys

from cluster.config import ConfigError, TinyModelConfig, load_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="horizonrl", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run multi-turn RL training")
    t.add_argument("--config", help="YAML run config (default: built-in defaults)")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.lr=1e-4")
    t.add_argument("--resume", metavar="auto|PATH", help="continue from the newest checkpoint "
                   "of this run name and seed (auto), or from a checkpoint or run folder")
    m = sub.add_parser("make-tiny-model", help="build the offline tiny Qwen2 model + tokenizer")
    m.add_argument("out", help="output folder (save_pretrained format)")
    m.add_argument("--config", help="take env and model.tiny settings from this run config")
    m.add_argument("overrides", nargs="*", help="dotted overrides of the run config")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"horizonrl: {exc}", file=sys.stderr)
        return 2
    if args.command == "train":
        from cluster.run import train

        try:
            train(cfg, resume=args.resume)
        except FileNotFoundError as exc:
            print(f"horizonrl: {exc}", file=sys.stderr)
            return 2
        return 0
    from cluster.tiny_model import build_tiny_model

    t: TinyModelConfig = cfg.model.tiny
    build_tiny_model(args.out, env_name=cfg.env.name, env_kwargs=cfg.env.kwargs,
                     vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                     num_layers=t.num_layers, transcripts=t.transcripts, max_turns=t.max_turns,
                     pretrain_steps=t.pretrain_steps, batch_size=t.batch_size, lr=t.lr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
