"""The one recipe applier: what accelerate() and `overdrive train` both run, and the overrides they record."""

import dataclasses
import json
import sys

import pytest
import torch
import torch.distributed as dist
from torch import nn

from fakes import TE_OK, TORCHAO_EMU, machine
from overdrive.convert import Applied, apply_recipe, optimizer_under_fsdp
from overdrive.env import build_report
from overdrive.models import GPT, gpt_config
from overdrive.recipes import get_recipe, resolve
from overdrive.train import load_config

pytest.importorskip("torchao")
CPU = build_report(machine(None, torchao=TORCHAO_EMU))
TINY = ["data.builtin_tokens=20000", "train.seq_len=32", "train.global_batch=4", "train.micro_batch=2",
        "train.log_every=1", "train.eval_every=0", "train.steps=2", "train.checkpoint_every=0", "model.n_embd=32",
        "model.n_head=2", "model.n_layer=2"]


@pytest.fixture
def one_rank(tmp_path):
    """A real 1-rank gloo process group: FSDP2 shards for real, with nothing to all-gather."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("impl,device,want,changed", [
    ("torch-fused", "cuda", "torch-fused", False), ("foreach", "cuda", "foreach", False),
    ("apex", "cuda", "torch-fused", True), ("torch-fused", "cpu", "for-loop", True),
    ("for-loop", "cpu", "for-loop", False)])
def test_adamw_under_fsdp_keeps_fused_on_cuda(impl, device, want, changed):
    got, why = optimizer_under_fsdp(impl, device)
    assert got == want and (why is not None) == changed


def test_trainer_records_every_override(one_rank, tmp_path, monkeypatch):
    from overdrive.train import trainer

    monkeypatch.setattr(trainer, "get_env", lambda: CPU)
    cfg = load_config(None, TINY + [f"train.out_dir=\"{tmp_path}\"", "train.activation_checkpointing=\"full\""])
    recipe = get_recipe("fp32", compile="default", optimizer="torch-fused")
    model = GPT(gpt_config("tiny", n_embd=32, n_head=2))
    applied = trainer._prepare(model, recipe, cfg, world=1, device="cpu", fsdp=True)
    res = applied.resolved
    assert res.recipe.name == recipe.name != "custom"  # the name the user gave, with its overrides
    assert res.compile == "default" and res.optimizer == "for-loop"  # what runs
    by_field = {d.field: d for d in res.decisions if d.fallback}
    assert "for-loop" in by_field["optimizer"].chosen
    # FSDP2 + compile: each block compiled in place before fully_shard (torchtitan's order), not eager
    comp = [d for d in res.decisions if d.field == "compile"][-1]
    assert comp.chosen == "default per block" and not comp.fallback and "before fully_shard" in comp.reason
    assert all(b._compiled_call_impl is not None for b in model.blocks) and model._compiled_call_impl is None
    assert applied.checkpointed == ["blocks.0", "blocks.1"] and applied.sharded == ["blocks.0", "blocks.1", ""]
    assert json.loads(json.dumps(res.to_dict()))["optimizer"] == "for-loop"


@pytest.mark.slow  # ~10 s: emulated FP8 under FSDP2
def test_fp8_all_gather_under_fsdp_trains(one_rank):
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", n_embd=64, n_head=2, block_size=32))
    applied = apply_recipe(model, resolve("fp8", CPU), fsdp=True, world=1)
    assert applied.fp8_all_gather
    assert isinstance(model.blocks[0].mlp.fc.weight._local_tensor, WeightWithDynamicFloat8CastTensor)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
    x = torch.randint(0, 256, (4, 33), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(3):
        with applied.autocast():
            _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        applied.after_optimizer_step()  # one all-reduce for every FP8 weight's scale
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    rowwise = apply_recipe(GPT(gpt_config("tiny", n_embd=64, n_head=2)), resolve("fp8-rowwise", CPU), fsdp=True)
    assert not rowwise.fp8_all_gather
    assert any(d.field == "fp8_all_gather" and d.chosen == "bf16" for d in rowwise.resolved.decisions)


@pytest.mark.parametrize("installed, recompute", [("0.10.0", True), ("0.11.0+cu126", True), ("0.12.0", False),
                                                   ("0.18.0", False)])
def test_torchao_before_0_12_recomputes_the_gathered_fp8_weight_under_fsdp(monkeypatch, installed, recompute):
    """torchao 0.10/0.11 under FSDP: force_recompute_fp8_weight_in_bwd, else torch.compile keeps a float8 copy of
    every gathered weight from forward to backward (pytorch/pytorch#141881); 0.12 made the flag a deprecated no-op."""
    import importlib.metadata as md

    from overdrive.convert.fp8 import convert_fp8

    real = md.version
    monkeypatch.setattr(md, "version", lambda name: installed if name == "torchao" else real(name))
    for fsdp in (True, False):
        model = GPT(gpt_config("tiny", n_embd=64, n_head=2, block_size=32))
        decs = convert_fp8(model, backend="emulated", scaling="tensorwise", min_dim=16,
                           enable_fsdp_float8_all_gather=fsdp)
        f8 = [m for m in model.modules() if type(m).__name__ == "Float8Linear"]
        assert f8 and len(f8) == sum(d.converted for d in decs)
        assert {m.config.force_recompute_fp8_weight_in_bwd for m in f8} == {recompute and fsdp}
        assert {m.config.enable_fsdp_float8_all_gather for m in f8} == {fsdp}


def test_fp16_under_fsdp_on_two_ranks_uses_the_sharded_scaler():
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    res = resolve("amp-fp16", CPU)
    two = Applied(model=nn.Linear(2, 2), resolved=res, fsdp=True, world=2).grad_scaler()
    one = Applied(model=nn.Linear(2, 2), resolved=res, fsdp=False, world=1).grad_scaler()
    assert isinstance(two, ShardedGradScaler) and not isinstance(one, ShardedGradScaler)
    assert Applied(model=nn.Linear(2, 2), resolved=resolve("fp32", CPU)).grad_scaler() is None


def test_zero_fp8_layers_is_reported_as_a_fallback():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(37, 29)

        def forward(self, x):
            return self.fc(x)

    applied = apply_recipe(Tiny(), resolve("fp8", CPU))
    d = [d for d in applied.resolved.decisions if d.field == "fp8_layers"]
    assert d and d[0].fallback and "no FP8 effect" in d[0].reason


# -- Transformer Engine's FP8 autocast must be entered by the training loop ---------------------------
_TE_STATE: dict = {}


@pytest.fixture
def fake_te(monkeypatch):
    from fakes import fake_te as make_fake_te

    mods, state = make_fake_te("2.9.0")  # TE's signatures, its dim checks under its FP8 autocast
    _TE_STATE.clear()
    _TE_STATE.update(state=state)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    te_gpu = build_report(machine("h100", te=TE_OK))
    real = resolve

    def resolve_on_cpu(recipe, env, **kw):  # decide as on an H100 with TE, run on this CPU
        return dataclasses.replace(real(recipe, te_gpu, **kw), device="cpu", autocast_dtype=None,
                                   fp8_min_dim=16, norm="torch")

    return resolve_on_cpu


def test_training_loop_enters_te_fp8_autocast(fake_te, tmp_path, monkeypatch):
    from overdrive.train import trainer

    monkeypatch.setattr(trainer, "resolve", fake_te)
    cfg = load_config(None, TINY + [f"train.out_dir=\"{tmp_path}\"", "train.recipe=\"fp8\""])
    trainer.train(cfg, quiet=True)
    state = _TE_STATE["state"]
    assert state["calls"] and all(c["fp8"] for c in state["calls"]), "te.Linear ran outside TE's FP8 autocast"
    assert state["depth"] == 0 and set(state["recipes"]) == {"Float8CurrentScaling"}
    rec = json.loads((tmp_path / "recipe.json").read_text())
    assert rec["fp8_backend"] == "transformer_engine"
    conv = json.loads((tmp_path / "conversions.json").read_text())["conversions"]["fp8"]
    assert any(d["converted"] for d in conv)


@pytest.mark.slow  # ~20-40 s: inductor compiles two blocks on CPU
def test_fsdp_with_compile_per_block_trains_like_eager(one_rank):
    """FSDP2 + compile: each block compiled in place, then fully_shard (torchtitan's order), matches eager."""
    losses = {}
    for mode in ("off", "default"):
        torch.manual_seed(0)
        model = GPT(gpt_config("tiny", n_embd=32, n_head=2, n_layer=2, block_size=16))
        apply_recipe(model, resolve(get_recipe("fp32", compile=mode, optimizer="for-loop"), CPU), fsdp=True, world=1)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
        x = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
        out = []
        for _ in range(3):
            _, loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        losses[mode] = out
        if mode == "default":
            assert all(b._compiled_call_impl is not None for b in model.blocks)
    assert losses["default"] == pytest.approx(losses["off"], rel=1e-4, abs=1e-5)


def test_the_teacher_is_sharded_and_cast_like_the_student_under_fsdp(one_rank):
    """Under FSDP2 + bf16 the student's autocast is off (FSDP casts its parameters): a teacher left as it
    was ran a full fp32 forward on every rank each micro-step. It is sharded like the student, in bf16."""
    from torch.distributed.fsdp import FSDPModule

    from overdrive.convert.apply import prepare_teacher

    torch.manual_seed(0)
    student, teacher = GPT(gpt_config("tiny", n_embd=32, n_head=2)), GPT(gpt_config("tiny", n_embd=64, n_head=2))
    x = torch.randint(0, teacher.config.vocab_size, (2, 16))
    with torch.no_grad():
        ref = teacher(x)[0].float()
    applied = apply_recipe(student, resolve("amp-bf16", CPU), fsdp=True, world=1)
    assert applied.autocast_dtype is None  # the student's forward gets no autocast: FSDP casts instead
    what = prepare_teacher(teacher, applied)
    assert "sharded" in what and "bfloat16" in what
    assert isinstance(teacher, FSDPModule) and all(isinstance(b, FSDPModule) for b in teacher.blocks)
    assert not any(p.requires_grad for p in teacher.parameters())
    with torch.no_grad(), applied.autocast():
        got = teacher(x)[0]
    assert got.dtype == torch.bfloat16  # computed in the recipe's dtype, not fp32
    rel = ((got.float() - ref).norm() / ref.norm()).item()
    assert rel < 3e-2, rel  # bf16 against the fp32 teacher
    # Without FSDP: replicated, run under the student's autocast (on in that case)
    plain = apply_recipe(GPT(gpt_config("tiny", n_embd=32, n_head=2)), resolve("amp-bf16", CPU))
    assert "replicated" in prepare_teacher(GPT(gpt_config("tiny", n_embd=32, n_head=2)), plain)
    assert plain.autocast_dtype == torch.bfloat16


def test_fsdp_leaves_the_move_to_fully_shard_block_by_block(one_rank, monkeypatch):
    """Under FSDP2 the whole fp32 model was moved to the device before sharding: a full copy on every
    rank (a 7B+ model OOMs on 8 GPUs). fully_shard moves each block's own states as it shards it; the
    root is never moved whole. Without FSDP (or where a device-checked kernel needs it) it still is."""
    from torch.distributed.fsdp import FSDPModule

    moved = []
    real = nn.Module.to
    monkeypatch.setattr(nn.Module, "to", lambda self, *a, **k: moved.append(type(self).__name__) or real(self, *a, **k))
    model = GPT(gpt_config("tiny", n_embd=32, n_head=2))
    applied = apply_recipe(model, resolve("amp-bf16", CPU), fsdp=True, world=1)
    assert "GPT" not in moved and isinstance(model, FSDPModule)
    assert any(d.field == "placement" and "one full block at a time" in d.reason for d in applied.resolved.decisions)
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    _, loss = model(x, x)
    loss.backward()  # trains as before
    moved.clear()
    apply_recipe(GPT(gpt_config("tiny", n_embd=32, n_head=2)), resolve("amp-bf16", CPU))
    assert "GPT" in moved


def test_fsdp_hooks_stay_outside_the_blocks_compiled_in_place(one_rank):
    """Each block is compiled in place (nn.Module.compile, so state_dict keys stay plain) and then
    sharded. FSDP2's hooks run outside the compiled graphs (dynamo skips them: `skip_fsdp_hooks`), as
    with torchtitan's compiled wrapper: no graph break, one graph for the repeated blocks."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = GPT(gpt_config("tiny", n_embd=32, n_head=2))
    apply_recipe(model, resolve(get_recipe("fp32", compile="default", optimizer="for-loop"), CPU), fsdp=True, world=1)
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    for _ in range(2):
        _, loss = model(x, x)
        loss.backward()
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    assert not any("_orig_mod" in k for k in model.state_dict())


def test_compile_is_regional_one_graph_for_the_repeated_blocks():
    """Without FSDP too, each repeated block is compiled in place and the blocks share one graph (a
    whole-model compile unrolled every block: the GPU check's cold compile of a 24-layer GPT); a model
    without repeated blocks is compiled whole."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = GPT(gpt_config("tiny", n_embd=32, n_head=2))
    applied = apply_recipe(model, resolve(get_recipe("fp32", compile="default"), CPU))
    assert all(b._compiled_call_impl is not None for b in model.blocks) and model._compiled_call_impl is None
    comp = [d for d in applied.resolved.decisions if d.field == "compile"][-1]
    assert comp.chosen == "default per block" and "one graph serves them all" in comp.reason
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    _, loss = model(x, x)
    loss.backward()
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    flat = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    apply_recipe(flat, resolve(get_recipe("fp32", compile="default"), CPU))
    assert flat._compiled_call_impl is not None
