"""The graph server's memory-mapped reader of DGL tensor files agrees with DGL's own reader."""
import torch
from dgl.data.utils import load_tensors, save_tensors

from degnn.runtime.mapped_feats import install, load_tensors_mapped


def test_mapped_reader_matches_dgl(tmp_path):
    path = str(tmp_path / "node_feat.dgl")
    feats = {"_N/feat": torch.randn(50, 16), "_N/label": torch.randint(0, 5, (50,)),
             "_N/train_mask": torch.rand(50) > 0.5, "_N/half": torch.randn(50, 3).half(),
             "_N/ids": torch.arange(50, dtype=torch.int32), "_N/empty": torch.zeros(0, 4)}
    save_tensors(path, feats)
    want, got = load_tensors(path), load_tensors_mapped(path)
    assert want.keys() == got.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and torch.equal(got[k], want[k]), k
    # copy-on-write: writing a mapped tensor leaves the file alone
    got["_N/feat"][0] = 0.0
    assert torch.equal(load_tensors(path)["_N/feat"], feats["_N/feat"])


def test_other_files_go_to_dgls_reader(tmp_path, monkeypatch):
    bad = tmp_path / "x.dgl"
    bad.write_bytes(b"\x00" * 64)
    assert load_tensors_mapped(str(bad)) is None
    path = str(tmp_path / "t.dgl")
    save_tensors(path, {"a": torch.arange(3)})
    with open(path, "ab") as f:  # trailing bytes: not what this reader knows
        f.write(b"\x01")
    assert load_tensors_mapped(path) is None
    from dgl.distributed import partition
    monkeypatch.setattr(partition, "load_tensors", partition.load_tensors)  # undone after the test
    install()
    assert partition.load_tensors.degnn_mapped
    assert torch.equal(partition.load_tensors(path)["a"], torch.arange(3))
