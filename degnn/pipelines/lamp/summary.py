"""LAMP's keys of the run summary, from every trainer's statistics (the pipeline's extra_summary)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional


@dataclass
class LAMPSummary:
    """LAMP's own summary keys (besides degnn.metrics.summary.RunSummary); see lamp_summary."""

    codec: str
    bits: int
    engine: str
    roots: str
    grad: str
    halo_sync_steps: int
    weight_sync_steps: int
    sync_budget: Optional[float]
    history_sync_rows_per_batch: float
    prefetch: int
    fusion: bool
    owner_version_lag_mean: Optional[float]
    owner_version_lag_max: int
    nodes_computed_per_batch: float
    fusion_saved_share: float
    fusion_saved_share_requests: float
    owner_requests_per_computation: Optional[float]
    grad_rows_pushed_per_batch: float
    owner_grad_rows_joined_per_batch: float
    history_age_mean: Optional[float]
    history_age_max: int
    history_rows_used_per_batch: float
    roots_per_batch: float
    rpc_round_trips_per_batch: float
    owner_nodes_computed_per_batch: float
    trainer_cg_nodes_per_batch: float
    local_bytes_by_category: Dict[str, int]
    edges_kept_fraction: Optional[float]


def lamp_summary(ranks: List[dict], p, bits: int) -> LAMPSummary:
    """`ranks`: every trainer's {ages, stats, local, batches, fusion}; `p`: pipeline config."""
    batches = sum(r["batches"] for r in ranks) or 1
    age_sum = sum(r["ages"][0] for r in ranks)
    age_cnt = sum(r["ages"][1] for r in ranks)
    local: Dict[str, int] = {}
    for r in ranks:
        for k, v in r["local"].items():
            local[k] = local.get(k, 0) + v
    stat = {k: sum(r["stats"][k] for r in ranks) for k in ranks[0]["stats"]}
    done, separate, unfolded = (sum(r["fusion"][i] for r in ranks) for i in range(3))
    return LAMPSummary(**{"codec": p.codec, "bits": bits,
            "engine": p.engine, "roots": p.roots, "grad": p.grad, "halo_sync_steps": p.halo_sync_steps, "weight_sync_steps": p.weight_sync_steps,
            "sync_budget": p.sync_budget,
            # halo history rows the syncs brought to this machine (per batch of a trainer)
            "history_sync_rows_per_batch": stat["sync_rows"] / batches,
            "prefetch": int(p.prefetch), "fusion": bool(p.fusion),
            # staleness the pipeline adds: steps between the owners' weights and the step that
            # uses their answer (at most prefetch + weight_sync_steps, +1 as trainers may be a
            # step apart)
            "owner_version_lag_mean": stat["lag_sum"] / stat["answers"] if stat["answers"] else None,
            "owner_version_lag_max": max(r["stats"]["lag_max"] for r in ranks),
            # (node, layer) computations per batch, trainer and owners: done, and the share saved
            # against no fusion at all and against owners not merging queued requests
            # (graph.fusion_counts)
            "nodes_computed_per_batch": done / batches,
            "fusion_saved_share": 1 - done / unfolded if unfolded else 0.0,
            "fusion_saved_share_requests": 1 - done / separate if separate else 0.0,
            "owner_requests_per_computation": (stat["merged"] / stat["computations"]
                                               if stat["computations"] else None),
            # grad=push: gradient rows sent to owners, and rows whose parameter gradients the
            # owners handed to their machine's trainer (one step or more later)
            "grad_rows_pushed_per_batch": stat["grad_rows"] / batches,
            "owner_grad_rows_joined_per_batch": stat["owner_grad_rows"] / batches,
            "history_age_mean": age_sum / age_cnt if age_cnt else None,
            "history_age_max": max(r["ages"][2] for r in ranks),
            "history_rows_used_per_batch": age_cnt / batches,
            "roots_per_batch": stat["roots"] / batches,
            # rounds of requests that cross machines: the LAMP round, plus the halo syncs
            "rpc_round_trips_per_batch": stat["rounds"] / batches,
            "owner_nodes_computed_per_batch": stat["owner_nodes"] / batches,
            "trainer_cg_nodes_per_batch": stat["cg_nodes"] / batches,
            "local_bytes_by_category": local,
            # link prediction: the share of the partitions' edges that supervise (both endpoints
            # owned by the machine, LinkTask.own_ids)
            "edges_kept_fraction": (sum(r["edges"][0] for r in ranks) / max(1.0, sum(r["edges"][1] for r in ranks))
                                    if ranks[0].get("edges") else None)})
