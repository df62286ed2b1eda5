"""A mid-size GPT as a user's model for `overdrive tune` (what scripts/gpu_check.sh runs on a GPU):

    overdrive tune --model examples/tune_gpt.py:make_model --batch examples/tune_gpt.py:batch \
        --loss-fn examples/tune_gpt.py:loss --budget-s 120 --out out/tune
"""

import torch

from overdrive.models import GPT, gpt_config

SEQ, BATCH, VOCAB = 1024, 4, 32768  # ~7 GB per candidate process: a dozen share one GPU


def make_model():
    # ~350M parameters at d=1024 x 24 layers would be "medium"; 12 layers keeps the check short.
    return GPT(gpt_config("gpt-125m", n_embd=1024, n_head=16, n_layer=12, block_size=SEQ, vocab_size=VOCAB))


def batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def loss(model, b):
    return model(b[0], b[1])[1]  # GPT returns (logits, loss)
