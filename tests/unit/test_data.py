"""One token batcher for bench and train: memory-mapped in the file's own dtype, batches that depend
only on (seed, step), the same global batch whatever the world size."""

import numpy as np
import torch

from overdrive.data import TokenData, file_tokens, load_tokens


def test_text_stays_a_uint8_memory_map_and_only_the_batch_is_widened(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(bytes(range(256)) * 64)
    toks = file_tokens(p)
    td = TokenData(toks, seq_len=32, seed=3)
    # No private int64 copy of the file (8x its size per bench worker): a view of the map.
    assert isinstance(td.train, np.memmap) and td.train.dtype == np.uint8
    x, y = td.get(7, 4)
    assert x.dtype == torch.int64 and x.shape == (4, 32) and (x[:, 1:] == y[:, :-1]).all()
    assert (td.get(7, 4)[0] == x).all() and not (td.get(8, 4)[0] == x).all()
    ids = tmp_path / "ids.bin"
    np.arange(3000, dtype=np.uint16).repeat(2).tofile(ids)
    t16, vocab = load_tokens(str(ids))
    assert isinstance(t16, np.memmap) and t16.dtype == np.uint16 and vocab == 3000


def test_rank_slices_make_up_the_global_batch():
    toks = np.arange(10_000, dtype=np.uint16) % 251
    td = TokenData(toks, seq_len=16, val_fraction=0.1, seed=0)
    whole_x, _ = td.get(5, 8)
    parts = [x for r in range(2) for x, _ in td.rank_micro_batches(5, 8, r, 2, 2)]
    assert torch.equal(torch.cat(parts), whole_x)
    vx, _ = td.get(5, 8, split="val")
    assert int(vx.min()) >= 0 and not torch.equal(vx, whole_x)
