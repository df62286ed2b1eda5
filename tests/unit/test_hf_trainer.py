"""A recipe under transformers.Trainer: the swaps and the precision really take effect, and cannot be undone
by TrainingArguments that disagree."""

import pytest
import torch

import overdrive
from fakes import TORCHAO_EMU, machine
from overdrive.env import build_report
from overdrive.errors import UserError
from overdrive.models.hf import build_hf_model

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("torchao")
CPU = build_report(machine(None, torchao=TORCHAO_EMU))


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n=8, seq=16):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 256, (n, seq), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _trainer(acc, tmp_path, **over):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4,
                                          logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
                                          **{**acc.training_args_kwargs(), **over})
    return transformers.Trainer(args=args, train_dataset=_Tokens(), **acc.trainer_kwargs())


def _record_dtypes(model):
    """(module class, output dtype) per leaf linear, as it ran."""
    seen = {}

    def hook(name):
        def f(mod, inp, out):
            seen[name] = (type(mod).__name__, out.dtype)
        return f

    for name, m in model.named_modules():
        if name.endswith(("q_proj", "down_proj", "lm_head")):
            m.register_forward_hook(hook(name))
    return seen


@pytest.mark.slow  # Trainer start-up and 3 steps: 10-40 s on a busy 2-core host
@pytest.mark.parametrize("recipe", ["amp-bf16", "fp8"])
def test_trainer_runs_the_recipe(recipe, tmp_path):
    torch.manual_seed(0)
    model = build_hf_model("llama", n_layer=2, d_model=64, n_head=4, vocab_size=256)
    acc = overdrive.accelerate(model, recipe, env=CPU, lr=3e-3)
    seen = _record_dtypes(model)
    out = _trainer(acc, tmp_path).train()
    assert out.global_step == 3 and acc.optimizer.state  # our optimizer took the steps
    q = seen["model.layers.0.self_attn.q_proj"]
    if recipe == "amp-bf16":
        assert acc.training_args_kwargs()["bf16"] is True
        assert q == ("Linear", torch.bfloat16) and seen["lm_head"][1] == torch.bfloat16
    else:  # emulated FP8 linears in the blocks, the head kept in high precision
        assert q[0] == "Float8Linear" and seen["model.layers.0.mlp.down_proj"][0] == "Float8Linear"
        assert seen["lm_head"] == ("Linear", torch.float32)


def test_trainer_arguments_that_undo_the_recipe_are_refused(tmp_path):
    model = build_hf_model("llama", n_layer=1, d_model=32, n_head=2, vocab_size=256)
    acc = overdrive.accelerate(model, "amp-bf16", env=CPU)
    with pytest.raises(UserError, match="bf16"):
        _trainer(acc, tmp_path, bf16=False).train()
