"""Exact resume on 2 gloo ranks (FSDP2): `train` stopped by SIGTERM (sent to rank 0 only: every rank
stops at the same step) and resumed, and acc.save/acc.load, both continue bit-exactly with dropout on."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

TINY = ["data.builtin_tokens=20000", "train.seq_len=16", "train.global_batch=8", "train.micro_batch=2",
        "train.log_every=1", "train.eval_every=0", "model.n_embd=16", "model.n_head=2", "model.n_layer=2",
        "model.dropout=0.2", "optimizer.lr=3e-3", "optimizer.warmup_steps=2", "train.steps=6",
        "train.checkpoint_every=0", "train.recipe=\"fp32\""]

_TRAIN = """
import json, os, signal, sys
from overdrive.train import TrainHooks, TrainingInterrupted, load_config, train
cut, resume, out = sys.argv[1] == "cut", sys.argv[2] == "resume", sys.argv[3]
rank = int(os.environ.get("RANK", "0"))
hooks = TrainHooks(on_step=lambda d: cut and rank == 0 and d == 3 and os.kill(os.getpid(), signal.SIGTERM))
try:
    res = train(load_config(None, sys.argv[4:]), resume=resume, quiet=True, hooks=hooks)
except TrainingInterrupted as e:
    print("STOPPED", e)
    sys.exit(0)
if rank == 0:
    json.dump({"losses": res.losses, "resumed_from": res.resumed_from}, open(out, "w"))
"""

_ACC = """
import json, os, sys
import torch
import torch.distributed as dist
import overdrive
phase, ck, out = sys.argv[1], sys.argv[2], sys.argv[3]

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.3))
                                           for _ in range(2)])
        self.head = torch.nn.Linear(8, 1)
    def forward(self, x):
        for b in self.blocks:
            x = torch.relu(b(x))
        return self.head(x)

torch.manual_seed(0 if phase != "resume" else 5)
acc = overdrive.accelerate(Net(), "fp32", lr=1e-2, distributed="fsdp", grad_accum_steps=2)
rank = dist.get_rank()
g = torch.Generator().manual_seed(100 + rank)
data = [(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)) for _ in range(8)]
start, stop = {"full": (0, 8), "cut": (0, 4), "resume": (4, 8)}[phase]
if phase == "resume":
    acc.load(ck)
losses = []
for x, y in data[start:stop]:
    loss = torch.nn.functional.mse_loss(acc.model(x), y)
    acc.backward(loss)
    acc.step()
    losses.append(loss.item())
if phase == "cut":
    acc.save(ck)
allp = [None] * dist.get_world_size()
dist.all_gather_object(allp, losses)
if rank == 0:
    json.dump(allp, open(out, "w"))
dist.destroy_process_group()
"""


def _torchrun(script, *args, port):
    cp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port",
                         str(port), script, *args], capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert cp.returncode == 0, cp.stderr[-3000:]
    return cp


def test_train_two_ranks_sigterm_then_resume_continues_bit_exactly(tmp_path):
    script = tmp_path / "t.py"
    script.write_text(_TRAIN)
    port = 29700 + os.getpid() % 200

    def sets(d):
        return [*TINY, f"train.out_dir=\"{tmp_path / d}\""]

    _torchrun(str(script), "full", "fresh", str(tmp_path / "ref.json"), *sets("ref"), port=port)
    cp = _torchrun(str(script), "cut", "fresh", str(tmp_path / "x.json"), *sets("cut"), port=port + 1)
    assert "stopped by SIGTERM after step 4" in cp.stdout  # rank 0's flag reached rank 1 in step 4's all-reduce
    _torchrun(str(script), "no", "resume", str(tmp_path / "res.json"), *sets("cut"), port=port + 2)
    ref, res = json.loads((tmp_path / "ref.json").read_text()), json.loads((tmp_path / "res.json").read_text())
    assert res["resumed_from"] == 4
    assert res["losses"] == ref["losses"][4:]


def test_acc_save_load_two_ranks_continues_bit_exactly(tmp_path):
    script = tmp_path / "a.py"
    script.write_text(_ACC)
    ck = str(tmp_path / "ck")
    port = 29900 + os.getpid() % 90
    _torchrun(str(script), "full", ck, str(tmp_path / "full.json"), port=port)
    _torchrun(str(script), "cut", ck, str(tmp_path / "cut.json"), port=port + 1)
    _torchrun(str(script), "resume", ck, str(tmp_path / "res.json"), port=port + 2)
    full, res = json.loads((tmp_path / "full.json").read_text()), json.loads((tmp_path / "res.json").read_text())
    assert [f[4:] for f in full] == res  # each rank's losses, exactly
