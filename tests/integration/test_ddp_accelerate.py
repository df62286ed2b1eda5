"""distributed="ddp", prepared DataLoaders and the process helpers on 2 gloo ranks, each against one process.

The first test runs docs/accelerate.md's Accelerate-style script (its DataLoader, DDP, accumulation, a save in
the middle of an epoch, a resume); the others check one feature each. About 5-8 s per launch."""

import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "accelerate.md"  # the README links it


def _readme_script(tmp_path) -> pathlib.Path:
    text = GUIDE.read_text()
    section = text[text.index("### Coming from Hugging Face Accelerate"):]
    code = re.search(r"```python ddp_train\.py[^\n]*\n(.*?)```", section, flags=re.S).group(1)
    path = tmp_path / "ddp_train.py"
    path.write_text(code)
    return path


def _free_port() -> int:
    with socket.socket() as s:  # the host is shared: a fixed port may be taken by another run
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args: list[str], tmp_path, ranks: int) -> str:
    launch = [sys.executable] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--master_port", str(_free_port())]
    cp = subprocess.run(launch + args, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path)))
    errors = [ln for ln in cp.stderr.splitlines() if "Error" in ln or "error" in ln][:20]
    assert cp.returncode == 0, f"{' '.join(args)} on {ranks} rank(s): " + "\n".join(errors) + cp.stderr[-1500:]
    return cp.stdout


def _losses(out: str) -> dict[tuple[int, int], float]:
    return {(int(e), int(b)): float(v) for e, b, v in re.findall(r"^epoch (\d+) batch (\d+) loss ([0-9.]+)$", out,
                                                                  flags=re.M)}


def test_readme_accelerate_style_script_on_two_ranks_resumes_on_the_next_batch_and_matches_one_process(tmp_path):
    script = str(_readme_script(tmp_path))
    two = _losses(_run([script, str(tmp_path / "ck2")], tmp_path, 2))
    resumed_out = _run([script, str(tmp_path / "ck2"), "--resume"], tmp_path, 2)
    resumed = _losses(resumed_out)
    one = _losses(_run([script, str(tmp_path / "ck1")], tmp_path, 1))
    assert len(one) == len(two) == 32  # 2 epochs x 16 global batches of 16
    assert min(resumed) == (0, 12), "the resumed run must start on the batch after the save (batch 11)"
    assert sorted(resumed) == [k for k in sorted(one) if k >= (0, 12)]
    diff_ranks = max(abs(two[k] - one[k]) for k in one)
    diff_resume = max(abs(resumed[k] - one[k]) for k in resumed)
    print(f"max |loss(2 ranks) - loss(1 process)| = {diff_ranks:.2e}; resumed vs 1 process: {diff_resume:.2e}")
    assert diff_ranks < 1e-5 and diff_resume < 1e-5, (diff_ranks, diff_resume)
    assert one[(1, 15)] < one[(0, 0)]
    # the unwrapped module's state_dict has the user's keys (no DDP "module." prefix)
    sd = torch.load(tmp_path / "ck2.pt", weights_only=True)
    assert sorted(sd) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert "accuracy" in resumed_out and resumed_out.count("last batch accuracy") == 1  # main process only


_FEATURES = r'''
import os, sys, torch, torch.nn.functional as F, overdrive
from torch.utils.data import DataLoader, TensorDataset

def say(*args):  # one write per line: the ranks share one stdout pipe (print writes each part apart)
    sys.stdout.write(" ".join(map(str, args)) + "\n")
    sys.stdout.flush()


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
ddp = "WORLD_SIZE" in os.environ  # under torchrun
acc = overdrive.accelerate(model, "fp32", optimizer=torch.optim.SGD(model.parameters(), lr=0.1), grad_accum_steps=4,
                           grad_clip=None, distributed="ddp" if ddp else None)
rank, world = acc.process_index, acc.num_processes
calls = []
if ddp:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def counting(state, bucket):
        calls.append(acc.steps)
        return allreduce_hook(state, bucket)

    acc.model.register_comm_hook(None, counting)
ds = TensorDataset(torch.arange(40).float()[:, None].repeat(1, 8) / 40, torch.arange(40) % 3)
loader = acc.prepare_dataloader(DataLoader(ds, batch_size=20 // world, shuffle=True))
seen = []
for epoch in range(2):
    for x, y in loader:
        seen.append(acc.gather((x[:, 0] * 40).round().long()).tolist())  # the global batch's sample ids
        loss = F.cross_entropy(acc.model(x), y)
        acc.backward(loss)
        acc.step()
say("SEEN", seen)
say("WEIGHT", float(acc.unwrap()[0].weight.double().sum()))
say("ALLREDUCE", len(calls), "STEPS", acc.steps)
# the collectives, against values every rank can compute
t = torch.full((rank + 1, 2), float(rank))                           # uneven dim 0
g = acc.gather({"t": t, "s": torch.tensor(rank), "b": [torch.tensor([rank == 0])]})
say("GATHER", g["t"].tolist(), g["s"].tolist(), g["b"][0].tolist())
r = torch.tensor([float(rank + 1)])
say("REDUCE", [float(acc.reduce(r, op)) for op in ("mean", "sum", "max", "min")], float(r),
      float(acc.reduce(torch.tensor(rank + 2), "mean")))
acc.main_print(f"MAIN {rank} {acc.is_main_process}\n", end="", flush=True)  # one write
acc.wait()
say("UNWRAP", type(acc.model).__name__, type(acc.unwrap()).__name__, acc.unwrap_model() is acc.unwrap())
'''


def _lines(out: str, key: str) -> list[str]:
    return [ln[len(key) + 1:] for ln in out.splitlines() if ln.startswith(key + " ")]


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("features")
    (tmp / "features.py").write_text(_FEATURES)
    return _run(["features.py"], tmp, 2), _run(["features.py"], tmp, 1)


def test_dataloader_two_ranks_see_the_one_process_global_batches_reshuffled_per_epoch(features):
    two, one = features
    seen2 = [eval(s) for s in _lines(two, "SEEN")]
    seen1 = eval(_lines(one, "SEEN")[0])
    assert seen2[0] == seen2[1]  # gather gives every rank the same
    assert len(seen1) == 4 and [sorted(b) for b in seen2[0]] == [sorted(b) for b in seen1]
    assert seen1[0] + seen1[1] != seen1[2] + seen1[3]  # epoch 1 is reshuffled
    assert sorted(seen1[0] + seen1[1]) == list(range(40))  # each epoch covers the data once


def test_ddp_accumulation_all_reduces_once_per_optimizer_step_and_matches_one_process(features):
    two, one = features
    # 4 batches, grad_accum_steps=4: one optimizer step; the model is one bucket -> 1 all-reduce, not 4
    assert _lines(two, "ALLREDUCE") == ["1 STEPS 1"] * 2
    w2, w1 = [float(v) for v in _lines(two, "WEIGHT")], float(_lines(one, "WEIGHT")[0])
    assert w2[0] == w2[1]  # ranks agree
    assert abs(w2[0] - w1) < 1e-5, (w2, w1)


def test_gather_reduce_main_print_wait_unwrap_on_two_ranks(features):
    two, one = features
    assert _lines(two, "GATHER") == ["[[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]] [0, 1] [True, False]"] * 2
    assert sorted(_lines(two, "REDUCE")) == ["[1.5, 3.0, 2.0, 1.0] 1.0 2.5", "[1.5, 3.0, 2.0, 1.0] 2.0 2.5"]
    assert _lines(two, "MAIN") == ["0 True"]  # printed by rank 0 only
    assert _lines(two, "UNWRAP") == ["DistributedDataParallel Sequential True"] * 2
    # one process: each helper is the identity
    assert _lines(one, "GATHER") == ["[[0.0, 0.0]] 0 [True]"]
    assert _lines(one, "REDUCE") == ["[1.0, 1.0, 1.0, 1.0] 1.0 2.0"]
    assert _lines(one, "UNWRAP") == ["Sequential Sequential True"]
