"""Does synthetic reading pre-training teach the tiny model to copy from its context?

    .venv/bin/python bench/reading_probe.py --config configs/textcraft-bc-rl.yaml \
        --variants 0:300 6000:900 --out docs/long-horizon/reading.json

Each variant `R:S` builds the config's tiny model with R reading tasks mixed into S
pre-training steps (into the model cache, so `horizonrl train ... model.tiny.reading=R
model.tiny.pretrain_steps=S` reuses it; build seconds from its marker file), then scores every
variant on the same held-out probe (cluster/model/reading.py: other line draws, other made-up names;
greedy exact match and teacher-forced token accuracy).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--variants", nargs="+", default=["0:300", "6000:900"],
                   help="reading tasks:pre-training steps")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.cluster.model.reading import observation_lines, probe_tasks, reading_accuracy
    from horizonrl.cluster.model.tiny_model import MODEL_MARKER, random_transcripts
    from horizonrl.protos.chat import ChatFormat, load_tokenizer

    torch.set_num_threads(1)
    rows = []
    for variant in args.variants:
        reading, steps = (int(x) for x in variant.split(":"))
        cfg = load_config(args.config, [f"model.tiny.reading={reading}",
                                        f"model.tiny.pretrain_steps={steps}"])
        tiny = cfg.model.tiny
        path = ensure_model(cfg.model, env=cfg.env)
        # The build's own time (the model may come from the cache): its marker records it.
        built = json.loads((path / MODEL_MARKER).read_text())["seconds"]
        episodes = random_transcripts(env_name=cfg.env.name, env_kwargs=cfg.env.kwargs,
                                      episodes=tiny.transcripts, max_turns=tiny.horizon,
                                      seed=0, thought=tiny.thought)
        probe = probe_tasks(observation_lines(episodes), seed=0)
        chat = ChatFormat(load_tokenizer(str(path)))
        model = AutoModelForCausalLM.from_pretrained(str(path))
        acc = reading_accuracy(model, chat, probe)
        rows.append({"reading_tasks": reading, "pretrain_steps": steps, "model": str(path),
                     "build_seconds": round(built, 1), "probe_tasks": len(probe),
                     "probe_accuracy": acc})
        print(f"[reading] {variant}: {acc} (build {built:.0f}s)", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": command_line(),
                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
