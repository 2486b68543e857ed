"""Config: YAML + dotted overrides, errors that name the field."""

from pathlib import Path

import pytest

from cluster.config import ConfigError, load_config

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
])
def test_bad_values_name_the_field(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("[", r"\[")):
        load_config(ROOT / "configs/babyai-local.yaml", [override])


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent.yaml")


def test_every_field_has_a_description():
    from cluster.config import RunConfig

    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann)

    walk(RunConfig)
