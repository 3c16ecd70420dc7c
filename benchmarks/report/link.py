"""bench=link: the TMA paper's Table 1 (link prediction, test MRR per method and model) per
dataset and bandwidth, its ordering checked, and LAMP's rows by number of layers."""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List

from ..records import bandwidth
from ..spread import cell, median, spread
from .runs import _beyond_allreduce, edges_kept, failure, fmt, method


# the TMA paper's Table 1 (ogbl-citation2, test MRR; docs/background.md, "TMA"), in its row order
TABLE1 = [("tma/supernode", "SuperTMA", 0.8375), ("tma/random", "RandomTMA", 0.8328),
          ("tma/psgd-pa", "PSGD-PA", 0.8240), ("distdgl", "distdgl (synchronous; the paper's GGS)", 0.8195),
          ("tma/llcg", "LLCG", 0.8188)]

MODEL_NAMES = {"sage": "GraphSAGE", "gcn": "GCN", "gat": "GAT"}


def link_method(s: dict) -> str:
    """A run's row of the link table: its method, LAMP's by its number of layers."""
    return f"lamp/L{s.get('layers')}" if s.get("pipeline") == "lamp" else method(s)


def link_section(runs: List[dict]) -> List[str]:
    """bench=link: the TMA paper's Table 1 (method x model, test MRR at the best validation MRR) per
    dataset and bandwidth, the paper's ordering checked, and the share of edges each method keeps;
    LAMP's rows (by layers) with their gap to distdgl and their bytes beyond the all-reduce."""
    ok = [s for s in runs if s.get("status") == "ok" and s.get("task") == "link" and not failure(s)
          and s.get("pipeline") in ("tma", "distdgl", "lamp")]
    if not ok:
        return []
    out = ["## Link prediction: the TMA paper's Table 1", "",
           "Test MRR (1000 negatives per held-out edge, OGB's Evaluator) at the best validation MRR, "
           "every method under the same training-time budget; over repeats the median (min–max), and "
           "the checks below on the medians. The paper's numbers are ogbl-citation2's (model not stated "
           "there). Edges kept: the share of the training graph's edges the method trains on (cut edges "
           "dropped).", ""]
    tables: Dict[tuple, Dict[tuple, List[dict]]] = defaultdict(lambda: defaultdict(list))
    for s in ok:
        tables[(s.get("dataset"), s.get("machines"), bandwidth(s))][(link_method(s), s.get("model"))].append(s)
    for (ds, machines, bw), cells in sorted(tables.items(), key=lambda kv: str(kv[0])):
        models = sorted({m for _, m in cells}, key=lambda m: list(MODEL_NAMES).index(m) if m in MODEL_NAMES else 9)
        out += [f"### {ds}, {machines} machines, {bw or 'unlimited'} links", "",
                "| method | " + " | ".join(MODEL_NAMES.get(m, str(m)) for m in models) + " | edges kept | paper |",
                "|" + "---|" * (len(models) + 3)]
        lamps = sorted({k for k, _ in cells if k.startswith("lamp/")})
        for key, name, paper in TABLE1 + [(k, f"LAMP (DEGNN), {k[6:]} layers", None) for k in lamps]:
            row = [cells.get((key, m)) for m in models]
            if not any(row):
                continue
            kept = next((edges_kept(r) for rs in row if rs for r in rs if edges_kept(r) is not None), None)
            out.append(f"| {name} | " + " | ".join(cell(spread(r.get("test") for r in rs), ".4f") if rs else "–"
                                                   for rs in row) + f" | {fmt(kept, '.3f')} | {fmt(paper)} |")
        out.append("")

        def test(key, m):
            rs = cells.get((key, m))
            return median(r["test"] for r in rs if r.get("test") is not None) if rs else None

        for m in models:
            sup, rnd, psgd = (test(k, m) for k in ("tma/supernode", "tma/random", "tma/psgd-pa"))
            if None not in (sup, rnd, psgd):
                kept = " / ".join(fmt(edges_kept(cells[(k, m)][0]), ".3f")
                                  for k in ("tma/supernode", "tma/random", "tma/psgd-pa"))
                out.append(f"- {MODEL_NAMES.get(m, m)}: SuperTMA ≥ RandomTMA > PSGD-PA "
                           f"{'holds' if sup >= rnd > psgd else 'does not hold'} (test {sup:.4f} / {rnd:.4f} / "
                           f"{psgd:.4f}; edges kept {kept}).")
            base = test("distdgl", m)
            best = max((k for k in ("tma/supernode", "tma/random") if test(k, m) is not None),
                       key=lambda k: test(k, m), default=None)
            if base is not None and best:
                gap = (test(best, m) - base) * 100
                out.append(f"- {MODEL_NAMES.get(m, m)}: best of RandomTMA/SuperTMA ({best}) against "
                           f"distdgl: {gap:+.2f} points of test MRR (bar, at most 1 point below: "
                           f"{'met' if gap >= -1 else 'not met'}).")
            runs_l = [(k, cells[(k, m)]) for k in lamps if cells.get((k, m))]
            for k, _ in runs_l:
                if base is not None:
                    layers = cells[("distdgl", m)][0].get("layers")
                    out.append(f"- {MODEL_NAMES.get(m, m)}: LAMP at {k[6:]} layers against distdgl "
                               f"({layers} layers): {(test(k, m) - base) * 100:+.2f} points of test MRR.")
            beyond = {k: median(b for b in map(_beyond_allreduce, rs) if b is not None) for k, rs in runs_l}
            if beyond.get("lamp/L2") and beyond.get("lamp/L3") is not None:
                ratio = beyond["lamp/L3"] / beyond["lamp/L2"]
                out.append(f"- {MODEL_NAMES.get(m, m)}: LAMP's wire bytes per batch beyond the all-reduce, 3 layers "
                           f"against 2: {ratio:.2f}x (bar, at most 1.5x: {'met' if ratio <= 1.5 else 'not met'}).")
        out.append("")
    return out
