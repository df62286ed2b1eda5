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


@pytest.mark.parametrize("text,msg", [
    ("[optimizer]\ngrad_clip = -1.0\n", "'optimizer.grad_clip' must be >= 0, got -1.0"),  # would flip gradients
    ("[train]\neval_batches = 0\n", "'train.eval_batches' must be >= 1"),  # printed val_loss=0
    ("[train]\ncheckpoint_every = -5\n", "'train.checkpoint_every' must be >= 0"),  # saved every step
    ("[train]\neval_every = -1\n", "'train.eval_every' must be >= 0"),
    ("[train]\ndist_timeout_s = 0\n", "'train.dist_timeout_s' must be > 0"),
    ("[optimizer]\nlr = nan\n", "'optimizer.lr' must be a finite number"),
    ("[optimizer]\nbeta2 = 1.0\n", "'optimizer.beta2' must be in [0, 1)"),
    ("[model]\nn_embd = -64\n", "'model.n_embd' must be >= 1, got -64"),
    ("[model]\nn_embd = 66\nn_head = 4\n", "does not divide into 4 heads"),
    ("[data]\nvocab_size = -3\n", "'data.vocab_size' must be >= 1"),
    ("[teacher]\ntrain_steps = 5\nalpha = 1.5\n", "'teacher.alpha' must be in [0, 1]"),
])
def test_values_that_used_to_be_silently_wrong(tmp_path, text, msg):
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_config_and_data_paths_that_are_folders(tmp_path):
    from overdrive.data import DataError, load_tokens

    with pytest.raises(ConfigError, match="is a folder: pass a TOML file"):
        load_config(str(tmp_path))
    with pytest.raises(DataError, match="is a directory"):
        load_tokens(str(tmp_path))


def test_vocab_size_below_the_largest_token_id(tmp_path):
    import numpy as np

    from overdrive.data import DataError, load_tokens

    ids = tmp_path / "ids.bin"
    np.arange(5000, dtype=np.uint16).tofile(ids)
    toks, vocab = load_tokens(str(ids))
    assert vocab == 5000 and toks.dtype == np.uint16  # memory-mapped as stored, not widened
    with pytest.raises(DataError, match="largest token id is 4999; set data.vocab_size >= 5000"):
        load_tokens(str(ids), vocab_size=300)
    text = tmp_path / "t.txt"
    text.write_text("hello " * 500)
    with pytest.raises(DataError, match="ids 0-255"):
        load_tokens(str(text), vocab_size=100)
    assert load_tokens(str(text))[1] == 256
