"""accelerate(distributed="fsdp") under torchrun: docs/accelerate.md's script on 2 gloo ranks matches 1 process,
and its checkpoint, saved on 2 ranks, loads on 1."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import overdrive
from overdrive.models.hf import build_hf_model

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "accelerate.md"  # the README links it


def _script(tmp_path) -> pathlib.Path:
    text = GUIDE.read_text()
    section = text[text.index("### torchrun and FSDP2"):]
    code = re.search(r"```py[^\n]*\n(.*?)```", section, flags=re.S).group(1)  # "```python fsdp_llama.py OUT"
    path = tmp_path / "fsdp_llama.py"
    path.write_text(code)
    return path


def _losses(out: str) -> list[float]:
    return [float(v) for v in re.findall(r"^step \d+ loss ([0-9.]+)$", out, flags=re.M)]


def _run(cmd, tmp_path):
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path)))
    assert cp.returncode == 0, cp.stderr[-3000:]
    return _losses(cp.stdout)


def _loaded(path):
    acc = overdrive.accelerate(build_hf_model("llama", n_layer=2, d_model=64, n_head=4, vocab_size=256), "fp32")
    acc.load(str(path))
    return acc


def test_readme_fsdp_script_two_ranks_match_one_and_reload_on_one(tmp_path):
    script = _script(tmp_path)
    two = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                "--master_port", str(29600 + os.getpid() % 1000), str(script), str(tmp_path / "ck2")], tmp_path)
    one = _run([sys.executable, str(script), str(tmp_path / "ck1")], tmp_path)
    assert len(two) == len(one) == 5
    assert two[-1] < two[0]
    assert max(abs(a - b) for a, b in zip(two, one)) < 1e-4, (two, one)
    a, b = _loaded(tmp_path / "ck2"), _loaded(tmp_path / "ck1")  # the 2-rank shards, read by one process
    assert a.steps == b.steps == 5
    sb = b.model.state_dict()
    # Adam divides by sqrt(v): reduction-order differences in near-zero gradients move single weights by
    # up to ~lr per step, so compare whole tensors (relative L2), not elements.
    for k, v in a.model.state_dict().items():
        assert (v - sb[k]).norm() <= 1e-3 * sb[k].norm(), k
    sa = a.optimizer.state_dict()["state"]
    assert sa and all(float(s["step"]) == 5 for s in sa.values())
    assert not (tmp_path / "ck2.tmp").exists()


_FP16_SCRIPT = '''
import torch, torch.distributed as dist, overdrive
from overdrive.models.hf import build_hf_model

torch.manual_seed(0)
acc = overdrive.accelerate(build_hf_model("llama", n_layer=2, d_model=32, n_head=2, vocab_size=128), "amp-fp16",
                           distributed="fsdp")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(0))[rank::world]
for step in range(3):
    acc.backward(acc.model(input_ids=x, labels=x).loss)
    if step == 1 and rank == 1:  # an overflow on one rank only
        next(p for p in acc.model.parameters() if p.grad is not None).grad.fill_(float("inf"))
    info = acc.step()
    print(f"rank {rank} step {step} skipped {bool(info['skipped'])} scaler {type(acc.scaler).__name__}")
'''


def test_fp16_under_fsdp_skips_on_every_rank_when_one_overflows(tmp_path):
    script = tmp_path / "fp16.py"
    script.write_text(_FP16_SCRIPT)
    cp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port",
                         str(29700 + os.getpid() % 1000), str(script)], capture_output=True, text=True, timeout=600,
                        cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path)))
    assert cp.returncode == 0, cp.stderr[-3000:]
    lines = set(re.findall(r"rank (\d) step (\d) skipped (True|False) scaler (\w+Scaler)", cp.stdout))
    # torch.amp.GradScaler would skip on rank 1 only, and the ranks' scales would part
    assert lines == {(r, s, "True" if s == "1" else "False", "ShardedGradScaler") for r in "01" for s in "012"}, cp.stdout
