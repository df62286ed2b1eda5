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


def _losses(model, tmp_path, acc=None, **args):
    """Per-step training losses of a seeded Trainer run (through Overdrive when acc is given)."""
    kw = {"output_dir": str(tmp_path), "max_steps": 4, "per_device_train_batch_size": 2, "logging_steps": 1,
          "save_strategy": "no", "report_to": [], "disable_tqdm": True, "seed": 0, **args}
    extra = acc.trainer_kwargs() if acc is not None else {"model": model}
    if acc is not None:
        kw.update(acc.training_args_kwargs())
    else:
        kw["use_cpu"] = True
    trainer = transformers.Trainer(args=transformers.TrainingArguments(**kw), train_dataset=_Tokens(n=16), **extra)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _tiny():
    torch.manual_seed(0)
    return build_hf_model("llama", n_layer=1, d_model=32, n_head=2, vocab_size=256)


@pytest.mark.parametrize("build_optimizer", [True, False])
def test_trainer_hyperparameters_win(build_optimizer, tmp_path):
    """docs/accelerate.md's pattern with the user's learning_rate and accumulation trains like the plain Trainer (it
    used to run Overdrive's AdamW at 3e-4 and raise 'multiple values' for gradient_accumulation_steps)."""
    import copy

    base = _tiny()
    user = dict(learning_rate=2e-3, gradient_accumulation_steps=2, weight_decay=0.01)
    plain = _losses(copy.deepcopy(base), tmp_path / "plain", **user)
    acc = overdrive.accelerate(copy.deepcopy(base), "fp32", env=CPU, build_optimizer=build_optimizer)
    ours = _losses(None, tmp_path / "od", acc=acc, **user)
    assert len(ours) == len(plain) == 4
    assert ours == pytest.approx(plain, rel=1e-4, abs=1e-5)
    text = acc.report()
    assert "Trainer's own" in text and "clipping, accumulation and the LR schedule: the Trainer's" in text
    assert "gradient clipping at 1" not in text


def test_trainer_lr_set_twice_differently_is_refused(tmp_path):
    acc = overdrive.accelerate(_tiny(), "fp32", env=CPU, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    with pytest.raises(UserError, match=r"learning_rate=0.002\) against the optimizer's lr 0.1.*set each once"):
        _losses(None, tmp_path, acc=acc, learning_rate=2e-3)


def test_trainer_uses_an_optimizer_chosen_in_accelerate(tmp_path):
    acc = overdrive.accelerate(_tiny(), "fp32", env=CPU, lr=3e-3)
    assert _losses(None, tmp_path, acc=acc) and acc.optimizer.state  # ours stepped: the user chose lr=3e-3
