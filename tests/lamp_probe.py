"""A probe of LAMP's service on a real cluster, started by the launcher in place of degnn.train
(`cluster.entry=tests.lamp_probe`, used by tests/test_lamp.py). Graph servers are degnn's own
(degnn.entry, which registers the services); each trainer sets up its machine's server,
then asks the *other* machine's server for LAMP answers, some of them bad on purpose, and writes
what it saw to <run dir>/probe_rank<r>.json.

With full fan-outs, 32 bits and histories holding the exact layer outputs (the evaluator's
whole-graph pass), the owner's answer must equal the exact h^(L-1) of the roots.
"""
from __future__ import annotations

import json
import os
import sys
import traceback


def trainer(argv) -> int:
    import dgl
    import torch
    import torch.distributed as dist

    from degnn.models import build_model
    from degnn.pipelines.lamp import service as S
    from degnn.pipelines.lamp.compute import GradRows, HistoryPull, HistoryRows, Roots, Setup, Weights
    from degnn.pipelines.lamp.graph import LocalGraph
    from degnn.pipelines.lamp.codec import make_codec
    from degnn.runtime import services
    from degnn.compat import strip_local_rank
    from degnn.runtime.context import RunContext
    from degnn.entry import compose_config, run_dir_from
    from degnn.runtime.partition_info import read_partition_json
    from degnn.tasks.evaluation import DistEvaluator
    from degnn.tasks.node import NodeTask
    import logging

    overrides, _ = strip_local_rank(argv)
    cfg = compose_config(overrides)
    run_dir = run_dir_from(overrides)
    services.register(cfg.pipeline.services)
    from degnn.runtime.rendezvous import shorten_connect_back_wait, wait_for_servers
    if os.environ.get("DGL_ROLE") == "server":  # started as degnn.train starts (rendezvous.py)
        shorten_connect_back_wait()
    else:
        wait_for_servers()
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    meta = read_partition_json(os.environ["DGL_CONF_PATH"])
    g = dgl.distributed.DistGraph(meta["graph_name"], part_config=os.environ["DGL_CONF_PATH"])
    pb = g.get_partition_book()
    me, other = pb.partid, 1 - pb.partid
    out = {"rank": rank}
    L, hidden = cfg.model.layers, cfg.model.hidden
    torch.manual_seed(0)
    model = build_model(cfg.model, g.ndata["feat"].shape[1], 5).eval()
    ctx = RunContext(cfg=cfg, run_dir=run_dir, rank=rank, world_size=dist.get_world_size(), local_rank=0,
                     machines=2, part_config=os.environ["DGL_CONF_PATH"], graph=g, log=logging.getLogger())
    task = NodeTask(cfg)
    task.num_classes = 5
    ev = DistEvaluator(ctx, model, task)
    ev.inference()
    model.eval()
    lg = LocalGraph.from_partition(g.local_partition)
    theirs = torch.nonzero(pb.nid2partid(torch.arange(g.num_nodes())) == other).flatten()[:50]
    mine = torch.nonzero(pb.nid2partid(torch.arange(g.num_nodes())) == me).flatten()[:5]

    def ask(req, machine=other):
        try:
            return S.call([(S.servers_of(machine)[0], req)])[0], None
        except S.LampServiceError as e:
            return None, str(e)

    # 1. a LAMP request to a server that is not set up yet: answered with an error
    dist.barrier()
    out["before_setup"] = ask(S.LampRequest(Roots(theirs, 0)))[1]
    dist.barrier()
    # 2. set up my machine's server: model, 32-bit exact histories, weights
    halo = torch.nonzero(~lg.inner).flatten()
    m = dict(kind=cfg.model.name, in_dim=g.ndata["feat"].shape[1], hidden=hidden, out_dim=5, layers=L,
             dropout=0.5, heads=cfg.model.heads, fanouts=[-1] * L, codec="minmax", bits=32, seed=0, history_layers=L - 2)
    reqs = [S.LampSetupRequest(Setup(m, halo, g.ndata["feat"][lg.nid[halo]], torch.nonzero(lg.inner).flatten()))]
    codec = make_codec("minmax", hidden, 32)
    for layer in range(1, L - 1):  # the histories the owners read: h^(1..L-2)
        reqs.append(S.HistoryPushRequest(HistoryRows.of(layer, torch.arange(lg.num_nodes),
                                                        ev.outputs[layer - 1][lg.nid], 0, codec)))
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(f"layers.{L - 1}.")}
    reqs.append(S.SetWeightsRequest(Weights(1, list(state), list(state.values()))))
    for r in reqs:
        S.call([(s, r) for s in S.servers_of(me)])
    dist.barrier()
    # 3. bad requests: roots the server does not own; a malformed pull; weights it cannot load
    out["not_owned"] = ask(S.LampRequest(Roots(mine, 1)))[1]
    out["bad_pull"] = ask(S.HistoryPullRequest(HistoryPull([1], [7], theirs, True, -1)))[1]
    out["bad_weights"] = ask(S.SetWeightsRequest(Weights(2, ["no.such.param"], [torch.zeros(1)])))[1]
    # 4. the same server still answers, exactly
    res, err = ask(S.LampRequest(Roots(theirs, 1)))
    out["good_error"] = err
    if res is not None:
        res = res.msg
        h = codec.decode(res.rows)
        exact = ev.outputs[L - 2][theirs]
        out["answer_rows"] = int(h.shape[0])
        out["max_abs_diff"] = float((h - exact).abs().max())
        out["scale"] = float(exact.abs().max())
        out["owner_nodes"] = res.counts[0]
        out["ages"] = list(res.ages)
        # 5. grad=push: gradient rows for those roots reach the owner's copy of the lower layers
        rows = codec.encode(torch.ones(len(theirs), hidden))
        out["push_error"] = ask(S.GradPushRequest(GradRows(theirs, rows)))[1]
        grads, out["pull_error"] = ask(S.GradPullRequest())
        if grads is not None:
            grads = grads.msg
            out["grad_rows"] = grads.rows
            out["grad_names"] = grads.names
            out["grad_norm"] = float(sum(t.norm() for t in grads.tensors))
    with open(os.path.join(run_dir, f"probe_rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    return 0


def main(argv) -> int:
    if os.environ.get("DGL_ROLE") == "server":
        from degnn.entry import main as entry_main

        return entry_main(argv)
    try:
        return trainer(argv)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
