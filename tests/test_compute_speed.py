"""benchmarks.compute_speed: its `time` mode runs degnn's torch backend (degnn.models.torch_layers)
as degnn's own SAGE model computes, where DGL cannot be imported, and its measurements become
records and RESULTS.md's table."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dgl
import pytest
import torch

from benchmarks import compute_speed as cs
from benchmarks.records import as_run, read_records
from degnn.models import GNN

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    """Two sampled 2-layer batches of synthetic-tiny (built offline into a fresh data root)."""
    root = tmp_path_factory.mktemp("compute")
    mp = pytest.MonkeyPatch()
    mp.setenv("DEGNN_DATA", str(root / "data"))
    try:
        path = root / "tiny.pt"
        meta = cs.sample(str(path), "synthetic-tiny", [5, 4], batch_size=64, batches=2, hidden=16, dropout=0.5, seed=0)
    finally:
        mp.undo()
    return path, meta


def test_sampled_blocks_are_a_trainers_batches(batches):
    _, meta = batches
    assert len(meta["batches"]) == 2 and meta["fanouts"] == [5, 4]
    for b in meta["batches"]:
        assert b["num_dst"][-1] == 64  # the seeds
        for s, d, ns, nd, e in zip(b["src"], b["dst"], b["num_src"], b["num_dst"], b["edges"]):
            assert len(s) == len(d) == e > 0
            assert int(s.max()) < ns and int(d.max()) < nd
        # a layer's destinations are the next layer's sources (DGL's block chain)
        assert b["num_dst"][0] == b["num_src"][1]


def test_torch_backend_computes_degnns_sage_model(batches):
    """Same weights, same blocks: the plain-torch layers give dgl.nn.SAGEConv's outputs, and their
    gradients flow through the sparse mean (the backward uses the transposed matrix). The hidden
    layer is wider than the input, so the first layer aggregates before it projects and the
    second projects first: both of SAGEConv's orders."""
    _, meta = batches
    torch.manual_seed(0)
    hidden = 2 * meta["in_dim"]
    assert meta["num_classes"] < hidden
    ref = GNN("sage", meta["in_dim"], hidden, meta["num_classes"], 2, dropout=0.0)
    plain = cs.PlainSage(meta["in_dim"], hidden, meta["num_classes"], 2, dropout=0.0)
    assert [lay.fc_neigh.in_features > lay.fc_neigh.out_features for lay in plain.layers] == [False, True]
    plain.load_state_dict(ref.state_dict())  # same parameter names
    b = meta["batches"][0]
    x = torch.randn(b["num_src"][0], meta["in_dim"], requires_grad=True)
    blocks = [dgl.create_block((s.long(), d.long()), num_src_nodes=ns, num_dst_nodes=nd)
              for s, d, ns, nd in zip(b["src"], b["dst"], b["num_src"], b["num_dst"])]
    adjs = cs.adjacencies(b, "cpu")
    want = ref(blocks, x)
    got = plain(adjs, x)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    gx_want = torch.autograd.grad(want.square().sum(), x)[0]
    gx_got = torch.autograd.grad(got.square().sum(), x)[0]
    assert torch.allclose(gx_got, gx_want, atol=1e-4, rtol=1e-3)


def test_time_runs_without_dgl_and_records_render(batches, tmp_path):
    path, _ = batches
    rep = tmp_path / "r0"
    rep.mkdir()
    # the GPU machine's side: the file run from a checkout, with dgl unimportable (and the tests'
    # PYTHONPATH gone: the file finds its checkout's degnn itself)
    code = ("import runpy, sys; sys.modules['dgl'] = None; "
            f"sys.argv = ['compute_speed.py', 'time', {str(path)!r}, '--rounds', '1', '--out', {str(rep / 'torch.json')!r}]; "
            f"runpy.run_path({str(REPO / 'benchmarks/compute_speed.py')!r}, run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    plain = json.loads((rep / "torch.json").read_text())
    assert plain["implementation"] == "torch" and plain["device"] == "cpu" and plain["steps"] == 2
    assert 0 < plain["step_ms_min"] <= plain["step_ms_median"] <= plain["step_ms_max"]
    assert plain["rel_error_vs_float64"] < 1e-5
    # this host's side: degnn's DGL model over the same batches
    assert cs.main(["dgl", str(path), "--rounds", "1", "--out", str(rep / "dgl.json")]) == 0
    records = tmp_path / "records"
    cs.record([str(rep)], str(records))
    recs = read_records(records)
    host = "-".join(re.findall(r"[a-z0-9]+", cs.cpu_name().lower()))
    assert {r["suite"] for r in recs} == {f"synthetic-tiny-b64-torch-cpu-t1-{host}", f"synthetic-tiny-b64-dgl-cpu-t1-{host}"}
    assert all(r["bench"] == "compute" and r["summary"]["status"] == "ok" for r in recs)
    lines = cs.compute_section([as_run(r) for r in recs])
    table = [line for line in lines if line.startswith("| synthetic-tiny")]
    assert len(table) == 2
    dgl_row = next(line for line in table if "dgl.nn.SAGEConv" in line)
    assert dgl_row.rstrip().endswith("| 1.00x |")  # the axis' 1x is this host's core on degnn's model


def test_record_refuses_an_empty_folder(tmp_path):
    with pytest.raises(SystemExit, match="no \\*.json"):
        cs.record([str(tmp_path)], str(tmp_path / "records"))


def test_a_missing_batch_file_is_named_with_the_command_that_makes_it(tmp_path):
    with pytest.raises(SystemExit, match="no such batch file; make one with"):
        cs.main(["time", str(tmp_path / "none.pt"), "--out", str(tmp_path / "x.json")])
