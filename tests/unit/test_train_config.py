"""Trainer config: strict keys and types, overrides, and the one-line messages."""

import pytest

from overdrive.train import ConfigError, load_config


def _write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return str(p)


def test_defaults_and_overrides(tmp_path):
    cfg = load_config(_write(tmp_path, "[train]\nsteps = 7\n"), ["train.recipe=amp-bf16", "optimizer.lr=1e-2",
                                                                 "model.n_embd=32"])
    assert cfg.train.steps == 7 and cfg.train.recipe == "amp-bf16" and cfg.optimizer.lr == 0.01
    assert cfg.model.n_embd == 32 and cfg.teacher is None


def test_example_configs_load():
    for ex in ("examples/tiny.toml", "examples/gpu-1b.toml"):
        cfg = load_config(ex)
        assert cfg.train.steps > 0


@pytest.mark.parametrize("text,msg", [
    ("[model]\nn_layers = 4\n", "unknown key 'model.n_layers': allowed keys in [model] are size, n_layer"),
    ("[train]\nsteps = \"ten\"\n", "'train.steps' must be an integer, got 'ten'"),
    ("[optimizer]\nlr = true\n", "'optimizer.lr' must be a number, got True"),
    ("[trian]\nsteps = 1\n", "unknown section [trian]: sections are model, data, optimizer, train, teacher"),
    ("[train]\nactivation_checkpointing = \"some\"\n", "allowed values are none, selective, full"),
    ("[train]\nrecipe = \"fp9\"\n", "presets are auto, baseline, fp32"),
    ("[model]\nsize = \"huge\"\n", "'model.size' = 'huge': sizes are tiny"),
    ("[train]\nmicro_batch = 0\n", "'train.micro_batch' must be >= 1"),
    ("[data]\nval_fraction = 0.9\n", "'data.val_fraction' must be in (0, 0.5)"),
    ("[train\n", "is not valid TOML"),
])
def test_bad_configs(tmp_path, text, msg):
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_bad_overrides_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="use section.key=value"):
        load_config(None, ["steps=3"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.toml"))
