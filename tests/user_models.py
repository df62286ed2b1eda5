"""Small user models written to a file, as a user hands them over (FILE.py:FACTORY), shared by tests."""

RANKER = '''
import torch
from torch import nn


class Ranker(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.lin = nn.Linear(12, 1)

    def forward(self, dense, ids):
        return torch.sigmoid(self.lin(torch.cat([dense, self.emb(ids).sum(1)], 1))).squeeze(1)


def make_ranker():
    torch.manual_seed(0)
    return Ranker()


def example(batch):
    g = torch.Generator().manual_seed(batch)
    return torch.randn(batch, 4, generator=g), torch.randint(0, 50, (batch, 6), generator=g)
'''
"""A two-input ranker (dense features and a bag of ids) returning (B,): make_ranker, example(batch)."""

TUNE_MLP = '''
import torch
from torch import nn


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


def loss(m, b):
    return nn.functional.cross_entropy(m(b[0]), b[1])


def nan_loss(m, b):
    return nn.functional.cross_entropy(m(b[0]), b[1]) * float("nan")
'''
"""A user's training step as tune takes it: model(), batch(step), loss(m, b) on a small MLP, and
nan_loss, a loss never finite."""
