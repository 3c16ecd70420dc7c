"""The table of every run (report.md only), and the quality bars: accuracy against one process
on the whole graph, bytes per batch as layers grow."""
from __future__ import annotations

from typing import Dict, List

from ..records import bandwidth
from .runs import failure, fmt, group_key, kb, method, train_setting


def table(runs: List[dict]) -> List[str]:
    lines = ["| pipeline | dataset | model | layers | machines | status | best val | test | epochs | "
             "train time (s) | epoch time (s) | net KB/batch | app KB/batch | all-reduce KB/batch | "
             "peak RSS trainer (MB) | run |",
             "|" + "---|" * 16]
    for s in runs:
        lines.append("| " + " | ".join([
            method(s) + (f" ({failure(s)})" if failure(s) else ""), str(s.get("dataset")),
            str(s.get("model", "–")), str(s.get("layers", "–")),
            str(s.get("machines", "–")) + (f" × {bandwidth(s)}" if bandwidth(s) else ""), str(s.get("status")), fmt(s.get("best_val")), fmt(s.get("test")),
            str(s.get("epochs", "–")), fmt(s.get("train_time_s"), ".1f"), fmt(s.get("epoch_time_s"), ".2f"),
            kb(s.get("net_bytes_per_batch")), kb(s.get("app_bytes_per_batch")),
            kb(s.get("allreduce_bytes_per_batch")), fmt(s.get("peak_rss_mb_trainer"), ".0f"),
            f"`{s['_rel']}`",
        ]) + " |")
    return lines


def comparisons(runs: List[dict]) -> List[str]:
    """The quality bars: accuracy against the single-process reference, bytes 2 -> 3 layers."""
    ok = [s for s in runs if s.get("status") == "ok"]
    # one run per group: variants, bandwidths and failures must not overwrite each other
    by_key: Dict[tuple, dict] = {group_key(s): s for s in ok}
    refs = {(s["dataset"], s.get("layers")): s for s in ok if s.get("pipeline") == "single"}
    out = []
    acc_rows = []
    for key, s in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        pipe, ds, layers = s["pipeline"], s.get("dataset"), s.get("layers")
        ref = refs.get((ds, layers))
        if pipe == "single" or ref is None or failure(s):
            continue
        if pipe == "tma":  # a fixed time budget, not trained to convergence: its own table
            continue
        pipe = method(s) + (f" {bandwidth(s)}" if bandwidth(s) else "")
        diff = (s["test"] - ref["test"]) * 100
        acc_rows.append(f"| {pipe} | {ds} | {layers} | {fmt(s['test'])} | {fmt(ref['test'])} | {diff:+.2f} | "
                        f"{s['epochs']} / {ref['epochs']} | {fmt(s['train_time_s'], '.0f')} / "
                        f"{fmt(ref['train_time_s'], '.0f')} |")
    if acc_rows:
        out += ["## Accuracy against one process on the whole graph", "",
                "Both trained until validation stopped improving; test at the best validation point, "
                "full-neighbour inference.", "",
                "| pipeline | dataset | layers | test | single-process test | difference (points) | "
                "epochs (dist / single) | train time s (dist / single) |", "|---|---|---|---|---|---|---|---|",
                *acc_rows, ""]
    growth = []
    for key, s in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        pipe, ds, layers = s["pipeline"], s.get("dataset"), s.get("layers")
        deeper = by_key.get(key[:3] + ((layers or 0) + 1,) + key[4:])
        # bytes per batch grow with the batch too: only a pair of one batch size compares layers
        if pipe == "single" or deeper is None or \
                train_setting(s, "batch_size") != train_setting(deeper, "batch_size"):
            continue
        pipe = method(s) + (f" {bandwidth(s)}" if bandwidth(s) else "")
        for key in ("net_bytes_per_batch", "app_bytes_per_batch"):
            a, b = s.get(key), deeper.get(key)
            if a and b:
                growth.append(f"| {pipe} | {ds} | {key} | {layers} -> {layers + 1} | {kb(a)} | {kb(b)} | "
                              f"{b / a:.2f}x |")
    if growth:
        out += ["## Bytes per batch as layers grow", "",
                "| pipeline | dataset | counter | layers | KB/batch before | KB/batch after | ratio |",
                "|---|---|---|---|---|---|---|", *growth, ""]
    return out
