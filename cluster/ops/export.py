"""`horizonrl export-hf`: a checkpoint as a plain `save_pretrained` folder for other tools.

The checkpoint folder already holds the HF model and tokenizer; the export copies them without
the learner's DeepSpeed state and the trainer's files, then loads the copy with transformers and
compares its logprobs on the checkpoint's probe sequence with what the learner recorded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from horizonrl.cluster.ops.checkpoints import LEARNER_DIR, PROBE_FILE, STATE_FILE, find_checkpoint

# The same precision on both sides (the probe says which); the exported weights are the
# learner's bit for bit (bf16 ones stored as fp32, exactly).
PROBE_TOL = 1e-4


def export_hf(source: str, out: str | Path) -> tuple[Path, float]:
    """Export the newest checkpoint under `source` (a run or checkpoint folder) to `out`;
    returns (checkpoint exported, max |transformers - learner| logprob on the probe)."""
    ckpt = find_checkpoint(source, run_root="", name="", seed=0)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    skip = {LEARNER_DIR, STATE_FILE, PROBE_FILE}
    for f in ckpt.iterdir():
        if f.name not in skip and f.is_file():
            shutil.copy2(f, out / f.name)
    return ckpt, probe_diff(out, ckpt / PROBE_FILE)


def probe_diff(model_dir: Path, probe_file: Path) -> float:
    """Max |logprob| difference between the model at `model_dir` (transformers, in the
    probe's precision) and a probe."""
    import torch
    from transformers import AutoModelForCausalLM

    from horizonrl.learner.algorithms import token_logprobs

    probe = json.loads(probe_file.read_text())
    # "bf16": a probe written before the learner took torch's dtype names; none: fp32.
    dtype = torch.bfloat16 if probe.get("dtype") in ("bfloat16", "bf16") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    ids = torch.tensor([probe["input_ids"]])
    with torch.no_grad():
        got = token_logprobs(model(input_ids=ids).logits, ids)[0].tolist()
    return max(abs(a - b) for a, b in zip(got, probe["logprobs"]))
