"""On a CUDA GPU: acc.save/acc.load and train --resume continue bit-exactly with dropout, the CUDA RNG
restored (dropout masks on the GPU come from it, not from the CPU generator). Run by scripts/gpu_check.sh."""

import os
import signal

import pytest
import torch
import torch.nn.functional as F

import overdrive

pytestmark = pytest.mark.gpu


def _acc(recipe, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Dropout(0.3), torch.nn.GELU(),
                                torch.nn.Linear(256, 64))
    return overdrive.accelerate(model, recipe, lr=1e-3)


@pytest.mark.parametrize("recipe", ["amp-bf16", "amp-fp16"])
def test_acc_save_load_continues_bit_exactly_on_cuda(tmp_path, recipe):
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(32, 64, generator=g).cuda() for _ in range(6)]

    def run(acc, xs):
        out = []
        for x in xs:
            loss = F.mse_loss(acc.model(x).float(), x)
            acc.backward(loss)
            acc.step()
            out.append(loss.detach().clone())
        return out

    want = run(_acc(recipe), data)
    a = _acc(recipe)
    run(a, data[:3])
    a.save(str(tmp_path / "ck"))
    torch.cuda.manual_seed_all(99)  # undone by the load
    b = _acc(recipe, seed=3)
    b.load(str(tmp_path / "ck"))
    got = run(b, data[3:])
    assert all(torch.equal(x, y) for x, y in zip(want[3:], got))


def test_amp_fp16_train_resumes_on_cuda(tmp_path):
    """The amp-fp16 run resumes (it used to fail on `scaler.update(float)` before any scale()). Not bit
    for bit here: the embedding's CUDA backward accumulates with atomics, in no fixed order."""
    from overdrive.train import TrainHooks, TrainingInterrupted, load_config, train

    sets = ["data.builtin_tokens=50000", "train.seq_len=32", "train.global_batch=8", "train.micro_batch=4",
            "train.eval_every=0", "model.n_embd=64", "model.n_head=2", "model.n_layer=2", "model.dropout=0.1",
            "train.steps=8", "train.checkpoint_every=0", "train.recipe=\"amp-fp16\""]
    ref = train(load_config(None, sets + [f"train.out_dir=\"{tmp_path / 'ref'}\""]), quiet=True)
    cut = load_config(None, sets + [f"train.out_dir=\"{tmp_path / 'cut'}\""])
    hooks = TrainHooks(on_step=lambda d: d == 4 and os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(TrainingInterrupted):
        train(cut, quiet=True, hooks=hooks)
    res = train(cut, resume=True, quiet=True)
    assert res.resumed_from == 4 and len(res.losses) == 4
    assert max(abs(a - b) / abs(a) for a, b in zip(ref.losses[4:], res.losses)) < 1e-2
