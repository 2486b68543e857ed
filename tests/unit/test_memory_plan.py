"""The memory plan against what it stands for: parameter counts against real HF models and the
published sizes, model states against DeepSpeed's own estimators, and the dry-run's verdict."""

from pathlib import Path

import pytest

from horizonrl.cluster.ops.memory_plan import ModelShape, activation_bytes, model_states_bytes

ROOT = Path(__file__).resolve().parents[2]
QWEN_7B = ModelShape.from_config(ROOT / "configs/models/qwen2.5-7b")


@pytest.mark.parametrize("tied", [True, False])
def test_parameter_count_equals_a_built_qwen2(tied):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=320, hidden_size=64, intermediate_size=176,
                      num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                      tie_word_embeddings=tied)
    model = Qwen2ForCausalLM(cfg)
    shape = ModelShape(vocab=320, hidden=64, intermediate=176, layers=3, heads=8, kv_heads=2,
                       tied=tied)
    assert shape.params() == sum(p.numel() for p in model.parameters())


def test_published_qwen_sizes():
    assert QWEN_7B.params() == pytest.approx(7.62e9, rel=0.005)
    assert ModelShape.from_config(ROOT / "configs/models/qwen2.5-3b").params() == pytest.approx(
        3.09e9, rel=0.005)


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("gpus", [2, 8])
def test_model_states_match_deepspeeds_estimators(stage, gpus):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    params = QWEN_7B.params()
    largest = max(QWEN_7B.layer_params(), QWEN_7B.vocab * QWEN_7B.hidden)
    ours = sum(model_states_bytes(params, zero_stage=stage, world_size=gpus, dtype="bfloat16",
                                  largest_layer=largest).values())
    if stage == 2:
        _, ds = estimate_zero2_model_states_mem_needs(params, gpus, 1, cpu_offload=False)
    else:
        _, ds, _ = estimate_zero3_model_states_mem_needs(params, largest, gpus, 1,
                                                         cpu_offload=False,
                                                         cpu_offload_params=False)
    assert ours == pytest.approx(ds, rel=0.10)


def test_checkpointing_and_precision_lower_the_estimate():
    full = activation_bytes(QWEN_7B, tokens=8192, dtype="bfloat16", checkpointing=False)
    ckpt = activation_bytes(QWEN_7B, tokens=8192, dtype="bfloat16", checkpointing=True)
    assert ckpt["activations"] < full["activations"] / 5
    assert ckpt["logits"] == full["logits"]  # the loss needs every logit either way
    fp32 = model_states_bytes(10**9, zero_stage=2, world_size=8, dtype="float32", largest_layer=0)
    assert fp32["master_weights"] == 0  # fp32 training updates the parameters themselves


def test_dry_run_says_what_does_not_fit(capsys):
    from horizonrl.cluster.cli import main

    args = ["train", "--config", str(ROOT / "configs/babyai-local.yaml"), "--dry-run",
            f"model.path={ROOT / 'configs/models/qwen2.5-7b'}", "learner.dtype=bfloat16",
            "generator.dtype=bfloat16", "generator.max_context_tokens=8192"]
    assert main([*args, "--gpu-memory-gib", "80"]) == 2  # ZeRO-2 on 2 ranks: ~80 GiB states
    out = capsys.readouterr().out
    assert "learner rank:" in out and "does not fit: needs" in out and "has 80.0" in out
    assert main([*args, "learner.world_size=8", "learner.zero_stage=3",
                 "learner.gradient_checkpointing=true", "learner.micro_batch_tokens=8192",
                 "ray.num_cpus=16",
                 "--gpu-memory-gib", "80"]) == 0
    assert "does not fit" not in capsys.readouterr().out


@pytest.mark.parametrize("path", sorted((ROOT / "configs/gpu").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_gpu_recipes_fit_the_node_they_describe(path):
    from horizonrl.cluster.cli import main

    assert main(["train", "--config", str(path), "--dry-run", "--resources", "CPU=96,GPU=8",
                 "--gpu-memory-gib", "80"]) == 0


def test_only_nodes_that_can_host_actors_make_a_run_multi_node() -> None:
    from horizonrl.cluster.ops.multinode import actor_nodes

    head = {"Alive": True, "NodeID": "h", "Resources": {"memory": 1e9}}  # KubeRay: num-cpus 0
    worker = {"Alive": True, "NodeID": "w", "Resources": {"CPU": 4.0}}
    gpu = {"Alive": True, "NodeID": "g", "Resources": {"GPU": 1.0}}
    dead = {"Alive": False, "NodeID": "d", "Resources": {"CPU": 8.0}}
    assert [n["NodeID"] for n in actor_nodes([head, worker, dead])] == ["w"]
    assert [n["NodeID"] for n in actor_nodes([head, worker, gpu])] == ["w", "g"]
