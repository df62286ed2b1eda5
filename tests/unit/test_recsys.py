"""The click model: embedding implementations agree, sparse optimizers touch only the batch's rows,
the planted click function is learned, and the Criteo TSV reader survives malformed lines."""

import numpy as np
import pytest
import torch

from overdrive.recsys import (DLRM, CriteoSpec, auc, build_optimizers, evaluate, read_criteo_tsv,
                              synthetic_clicks, train_step)

SMALL = CriteoSpec(table_sizes=tuple([997, 501, 203] + [101] * 23), multi_hot=(4, 3, 2) + (1,) * 23)


def test_embedding_implementations_agree_forward_and_backward():
    torch.manual_seed(0)
    b = synthetic_clicks(64, SMALL, seed=3)
    naive = DLRM(SMALL, embedding="embedding").double()
    fused = DLRM(SMALL, embedding="embeddingbag", sparse=True).double()
    fused.load_state_dict(naive.state_dict())  # same keys: tables.{i}.weight
    b64 = type(b)(b.dense.double(), b.values, b.offsets, b.labels.double())
    y1, y2 = naive(b64), fused(b64)
    assert torch.allclose(y1, y2, atol=1e-12)
    w = torch.randn(64, dtype=torch.float64)
    (y1 * w).sum().backward()
    (y2 * w).sum().backward()
    for t1, t2 in zip(naive.tables, fused.tables):
        g2 = t2.weight.grad
        assert g2.is_sparse
        assert torch.allclose(t1.weight.grad, g2.to_dense(), atol=1e-12)
    for (n, p1), p2 in zip(naive.bottom.named_parameters(), fused.bottom.parameters()):
        assert torch.allclose(p1.grad, p2.grad, atol=1e-12), n


@pytest.mark.parametrize("kind", ["sparse-adam", "sparse-adagrad"])
def test_sparse_optimizers_touch_only_the_rows_in_the_batch(kind):
    torch.manual_seed(0)
    m = DLRM(SMALL, embedding="embeddingbag", sparse=True)
    opts = build_optimizers(m, kind)
    b = synthetic_clicks(32, SMALL, seed=5)
    before = [t.weight.detach().clone() for t in m.tables]
    train_step(m, opts, b)
    for f, (t, w0) in enumerate(zip(m.tables, before)):
        changed = set(torch.nonzero((t.weight.detach() != w0).any(1)).flatten().tolist())
        used = set(b.values[f].tolist())
        assert changed <= used, f"table {f}: rows outside the batch changed"
        assert len(changed) >= len(used) - 1  # every looked-up row moved (a zero-gradient row may not)


def test_dense_adamw_with_sparse_tables_is_refused():
    m = DLRM(SMALL, embedding="embedding")
    with pytest.raises(ValueError, match="needs sparse gradients"):
        build_optimizers(m, "sparse-adam")


def test_planted_clicks_are_learned():
    torch.manual_seed(0)
    data = synthetic_clicks(24_000, SMALL, seed=0)
    train, val = data.slice(0, 20_000), data.slice(20_000, 24_000)
    m = DLRM(SMALL, embedding="embeddingbag", sparse=True)
    opts = build_optimizers(m, "sparse-adam", lr=3e-3)
    for i in range(0, 20_000, 256):
        train_step(m, opts, train.slice(i, min(i + 256, 20_000)))
    ev = evaluate(m, val)
    assert ev["auc"] > 0.72, ev  # chance is 0.5
    assert ev["logloss"] < ev["logloss_constant"] - 0.05


def test_auc_by_hand():
    assert auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == 0.75
    assert auc(np.array([0.5, 0.5, 0.5, 0.5]), np.array([0, 1, 0, 1])) == 0.5  # ties count half
    assert auc(np.array([1.0, 2.0]), np.array([0, 1])) == 1.0
    assert np.isnan(auc(np.array([1.0, 2.0]), np.array([1, 1])))


def test_criteo_tsv_reader_counts_malformed_lines(tmp_path):
    good = "1\t" + "\t".join(["3"] * 13) + "\t" + "\t".join(["68fd1e64"] * 26)
    missing = "0\t" + "\t".join([""] * 13) + "\t" + "\t".join([""] * 26)
    lines = [good, missing,
             "1\t2\t3",                                                            # too few fields
             "7\t" + "\t".join(["3"] * 13) + "\t" + "\t".join(["aa"] * 26),        # bad label
             "0\t" + "\t".join(["x"] * 13) + "\t" + "\t".join(["aa"] * 26),        # dense not int
             "0\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["zz"] * 26)]        # cat not hex
    p = tmp_path / "day_0.tsv"
    p.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe\n")
    batch, st = read_criteo_tsv(str(p), SMALL)
    assert st.lines == 7 and st.good == 2 and sum(st.malformed.values()) == 5
    assert st.malformed["label not 0/1"] == 1 and st.malformed["not UTF-8"] == 1
    assert "2 read, 5 malformed" in st.summary()
    assert batch.labels.tolist() == [1.0, 0.0] and batch.values[0].tolist() == [0x68fd1e64 % 997, 0]
    assert torch.allclose(batch.dense[0], torch.log1p(torch.tensor(3.0)).expand(13))
    m = DLRM(SMALL)
    assert m(batch).shape == (2,)


class _FakeKJT:
    """KeyedJaggedTensor as TorchRec lays it out: all of key 0's values, then key 1's, ..."""

    def __init__(self, keys, values, lengths):
        self.keys, self.values, self.lengths = keys, values, lengths

    @classmethod
    def from_lengths_sync(cls, keys, values, lengths):
        return cls(keys, values, lengths)


class _FakeEBC(torch.nn.Module):
    def __init__(self, tables, device=None):
        super().__init__()
        self.cfgs = tables
        self.embedding_bags = torch.nn.ModuleDict(
            {c.name: torch.nn.EmbeddingBag(c.num_embeddings, c.embedding_dim, mode="sum") for c in tables})

    def forward(self, kjt):
        B = kjt.lengths.numel() // len(kjt.keys)
        out, pos = {}, 0
        for i, c in enumerate(self.cfgs):
            lens = kjt.lengths[i * B:(i + 1) * B]
            vals = kjt.values[pos:pos + int(lens.sum())]
            pos += int(lens.sum())
            offs = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)[:-1]])
            out[c.feature_names[0]] = self.embedding_bags[c.name](vals, offs)

        class _KT:
            def to_dict(self_inner):
                return out

        return _KT()


def test_torchrec_path_with_a_fake_torchrec(monkeypatch):
    import sys
    import types
    from dataclasses import dataclass

    @dataclass
    class _Cfg:
        name: str
        embedding_dim: int
        num_embeddings: int
        feature_names: list

    fake = types.ModuleType("torchrec")
    fake.EmbeddingBagCollection, fake.EmbeddingBagConfig, fake.KeyedJaggedTensor = _FakeEBC, _Cfg, _FakeKJT
    monkeypatch.setitem(sys.modules, "torchrec", fake)
    torch.manual_seed(0)
    tr = DLRM(SMALL, embedding="torchrec")
    bag = DLRM(SMALL, embedding="embeddingbag")
    sd = {k.replace("ebc.embedding_bags.t", "tables."): v for k, v in tr.state_dict().items()}
    assert any(k.startswith("ebc.embedding_bags.t0") for k in tr.state_dict())
    assert not any(k.startswith("tables.") for k in tr.state_dict())  # parameters once, under ebc
    bag.load_state_dict(sd)
    b = synthetic_clicks(16, SMALL, seed=4)
    assert torch.allclose(tr(b), bag(b), atol=1e-6)
    opts = build_optimizers(tr, "dense-adamw")
    train_step(tr, opts, b)


def test_torchrec_candidate_unavailable_with_the_doctors_reason():
    import dataclasses

    from fakes import machine
    from overdrive.bench import run_bench
    from overdrive.env import build_report
    from overdrive.bench.workloads.recsys import RECSYS_SUITES

    facts = machine(None)
    facts["installed"]["torchrec"] = True
    facts["probes"]["torchrec"] = {"import_ok": False, "import_error": "OSError: Could not load this library: "
                                                                       "fbgemm_gpu/fbgemm_gpu_config.so"}
    env = build_report(facts)
    assert env.engine("torchrec").status == "broken" and "do not match this torch" in env.engine("torchrec").reason
    suite = RECSYS_SUITES["recsys-quick"]
    suite = dataclasses.replace(suite, rounds=1, steps_per_round=1, parity_steps=2, options=dict(
        suite.options, train_examples=3000, val_examples=1000, table_sizes=list(SMALL.table_sizes)))
    tr = next(c for c in suite.candidates if c.name == "torchrec-ebc")
    res = run_bench(suite.with_candidates((suite.candidates[0], tr)), env=env, micro=False, isolate=False, threads=1)
    c = next(c for c in res["configs"] if c["name"] == "torchrec-ebc")
    assert c["status"] == "unavailable" and "torchrec is broken" in c["reason"] and not c["safe"]
    assert res["configs"][0]["status"] == "ok"
