"""Config: YAML + dotted overrides, errors that name the field."""

from pathlib import Path

import pytest

from horizonrl.cluster.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_default_config_and_override():
    cfg = load_config(ROOT / "configs/babyai-local.yaml", ["learner.lr=1e-4", "seed=3"])
    assert cfg.learner.lr == 1e-4 and cfg.seed == 3
    assert cfg.env.name == "babyai"


@pytest.mark.parametrize("override,needle", [
    ("learner.lr=-1", "learner.lr"),
    ("learner.zero_stage=5", "learner.zero_stage"),
    ("learner.lrr=1", "learner.lrr"),
    ("env.name=nethack", "env.name"),
    ("curriculum.horizons=[5, 3]", "rise strictly"),
    ("no_equals_sign", "section.field=value"),
    ("init.sft_epochs=2", "init.demo_episodes"),
    ("init.replay_batch=8", "init.replay_batch > 0 needs demonstrations"),
    ("model.tiny.preset=xl", "model.tiny.preset"),
    ("generator.max_context_tokens=8192", "the tiny model's 4096 positions"),
    ("generator.tensor_parallel_size=2", "generator.num_gpus"),
])
def test_bad_values_name_the_field(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("[", r"\[")):
        load_config(ROOT / "configs/babyai-local.yaml", [override])


@pytest.mark.parametrize("override,needle", [
    ("learner.dynamic_sampling=true", r"learner\.dynamic_sampling .*mode=async"),
    ("learner.weight_sync=broadcast", r"learner\.weight_sync=broadcast .*mode=async"),
])
def test_settings_async_mode_would_ignore_are_refused_naming_both_fields(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(ROOT / "configs/babyai-local.yaml", ["mode=async", override])
    load_config(ROOT / "configs/babyai-local.yaml", ["mode=sync", override])  # fine in sync


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent.yaml")


def test_every_field_has_a_description():
    from horizonrl.cluster.config import RunConfig

    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann)

    walk(RunConfig)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert cfg.envs[0] is cfg.env


def test_the_recommended_maze_config_is_the_measured_recipe():
    """configs/babyai-maze-s-gigpo.yaml must stay what docs/long-horizon.md section 7 measured:
    the xs recipe's config with exactly the overrides of its commands (and its own name), the
    measured bfloat16 as `auto`: the same on the CPU that measured it (AVX-512 BF16), fp32 where
    bf16 would be emulated."""
    from horizonrl.protos.precision import engine_dtype, learner_dtype

    measured = load_config(ROOT / "configs/babyai-maze-bc-rl.yaml", [
        "init.eval_tasks=256", "model.tiny.preset=s", "learner.dtype=bfloat16",
        "generator.dtype=bfloat16", "learner.algorithm=gigpo", "name=babyai-maze-s-gigpo"])
    shipped = load_config(ROOT / "configs/babyai-maze-s-gigpo.yaml")
    assert learner_dtype(shipped.learner.dtype, native_bf16=True) == measured.learner.dtype
    assert engine_dtype(shipped.generator.dtype, native_bf16=True) == measured.generator.dtype
    for cfg in (shipped, measured):
        cfg.learner.dtype = cfg.generator.dtype = "auto"
    assert shipped.model_dump() == measured.model_dump()


def test_multi_env_labels_must_be_unique():
    with pytest.raises(ConfigError, match="labels must be unique"):
        load_config(None, ["extra_envs=[{name: babyai}]"])
    cfg = load_config(None, ["extra_envs=[{name: babyai, label: babyai-pickup, weight: 3}]"])
    assert [e.key for e in cfg.envs] == ["babyai", "babyai-pickup"]


def test_tasks_are_drawn_by_env_weight_and_reproducibly():
    from horizonrl.cluster.rollout.iteration import sample_tasks
    from horizonrl.envpool.base import EVAL_SEED_OFFSET

    cfg = load_config(None, ["generator.tasks_per_step=400",
                             "extra_envs=[{name: textcraft, weight: 3}]"])
    tasks = sample_tasks(cfg, step=5)
    share = sum(t.env == "textcraft" for t in tasks) / len(tasks)
    assert 0.68 < share < 0.82  # weight 3 of 4
    assert all(t.task_id == f"{t.env}-{t.seed}" and t.seed < EVAL_SEED_OFFSET for t in tasks)
    assert sample_tasks(cfg, step=5) == tasks and sample_tasks(cfg, step=6) != tasks
    single = load_config(None, ["generator.tasks_per_step=400"])
    assert {t.env for t in sample_tasks(single, step=5)} == {"babyai"}


def test_dynamic_sampling_rounds_draw_fresh_groups():
    from horizonrl.cluster.rollout.iteration import sample_tasks

    cfg = load_config(None)
    first, again = sample_tasks(cfg, 3), sample_tasks(cfg, 3, 1)
    assert all(t.group is None for t in first)
    assert all(t.group == f"s3r1-{t.task_id}" for t in again)
    assert [t.seed for t in again] != [t.seed for t in first]
    assert sample_tasks(cfg, 3, 1) == again


def test_difficulty_schedule_draws_envs_by_stage_weights():
    from horizonrl.cluster.rollout.iteration import sample_tasks

    stepwise = ["curriculum.schedule=stepwise", "curriculum.horizons=[4, 8]",
                "curriculum.steps_per_stage=3", "generator.tasks_per_step=16"]
    cfg = load_config(ROOT / "configs/mixed-local.yaml", [
        *stepwise, "curriculum.env_weights={babyai: [1, 0], deepsearch: [0, 1]}"])
    assert [e.key for e in cfg.envs] == ["babyai", "deepsearch"]
    assert {t.env for t in sample_tasks(cfg, 1)} == {"babyai"}  # stage 0
    assert {t.env for t in sample_tasks(cfg, 4)} == {"deepsearch"}  # stage 1
    with pytest.raises(ConfigError, match="not env labels"):
        load_config(ROOT / "configs/mixed-local.yaml", [
            *stepwise, "curriculum.env_weights={nowhere: [1, 1]}"])
    with pytest.raises(ConfigError, match="stage 1 gives every env weight 0"):
        load_config(ROOT / "configs/mixed-local.yaml", [
            *stepwise, "curriculum.env_weights={babyai: [1, 0], deepsearch: [1, 0]}"])


def test_a_context_longer_than_the_models_positions_fails_before_any_run(tmp_path, capsys):
    from horizonrl.cluster.cli import main

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"max_position_embeddings": 2048}')
    code = main(["train", "--config", str(ROOT / "configs/babyai-local.yaml"),
                 f"model.path={tmp_path / 'model'}", "generator.max_context_tokens=3000",
                 f"run_root={tmp_path / 'runs'}"])
    assert code == 2 and not (tmp_path / "runs").exists()
    assert "max_context_tokens (3000) exceeds max_position_embeddings (2048)" in (
        capsys.readouterr().err)


def test_tasks_split_over_generators_like_numpy_array_split():
    """One split for a step's tasks and an eval's: consecutive, sizes differing by one at
    most, the first shares taking the remainder."""
    import numpy as np

    from horizonrl.cluster.rollout.iteration import split_evenly

    for n in range(13):
        for parts in range(1, 5):
            got = split_evenly([f"t{i}" for i in range(n)], parts)
            want = [[f"t{i}" for i in idx] for idx in np.array_split(np.arange(n), parts)]
            assert got == want, (n, parts)


@pytest.mark.parametrize("old,new,read", [
    ("init.demo_max_turns=12", "init.demo_horizon", lambda c: c.init.demo_horizon == 12),
    ("init.eval_max_turns=7", "init.eval_horizon", lambda c: c.init.eval_horizon == 7),
    ("eval.max_turns=[2, 4]", "eval.horizons", lambda c: c.eval.horizons == [2, 4]),
    ("model.tiny.max_turns=9", "model.tiny.horizon", lambda c: c.model.tiny.horizon == 9),
    ("learner.dtype=bf16", "'bfloat16'", lambda c: c.learner.dtype == "bfloat16"),
    ("learner.dtype=fp32", "'float32'", lambda c: c.learner.dtype == "float32"),
])
def test_old_names_are_translated_naming_the_new_one(old, new, read):
    with pytest.warns(FutureWarning, match=new):
        cfg = load_config(ROOT / "configs/babyai-local.yaml", [old])
    assert read(cfg)


def test_an_old_and_a_new_name_together_are_refused():
    with pytest.raises(ConfigError, match=r"init\.demo_max_turns and init\.demo_horizon"):
        load_config(None, ["init.demo_max_turns=3", "init.demo_horizon=4"])


def test_the_tiny_models_cache_key_is_stable():
    """The key of the embedded default's model changes only on purpose (a 4-minute rebuild for
    every user): it survived the `max_turns` -> `horizon` rename, and changed once when
    reward-only env kwargs (`reward: binary` here) left it (tests/unit/test_model_cache_key.py)."""
    from horizonrl.cluster.model.load import tiny_model_dir

    cfg = load_config(ROOT / "configs/babyai-local.yaml")
    assert tiny_model_dir(cfg.model, cfg.env).name == "tiny-babyai-0110b00c6e"
