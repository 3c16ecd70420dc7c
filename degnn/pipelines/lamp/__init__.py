"""pipeline=lamp: DEGNN's decentralized batch processing with LAMP (docs/background.md,
"LAMP (DEGNN)"). The machines that own a batch's remote neighbours prepare them; bytes per batch stop
growing with the number of layers.

Following one batch takes four files: pipeline.py (`_issue`, `_complete`, `_after_step`) ->
owners.py (the trainer engine's rounds, behind engine.py's `Owners` interface) or service.py
(the graph servers' requests) -> compute.py (what an owner does: `Owner.answer`) -> graph.py (the
computation graph it builds).

One batch of a trainer (L layers, fan-outs f_0..f_{L-1}, input layer first):

1. Seeds from the trainer's own training nodes (link prediction: the endpoints of the batch's
   supervision edges and of their negatives, all nodes the machine owns), as the task picks them
   (Task.own_ids, Task.own_batch); the task's loss of the seeds' top-layer rows (Task.seed_loss:
   cross-entropy, or the link model's decoder on the pairs) runs inside the DDP forward. The
   locality-aware computation graph (graph.py) is built on the trainer's own partition: own
   nodes are expanded through their in-edges with the model's fan-outs; a sampled neighbour
   owned elsewhere (a halo node) is a leaf. Leaves of block 0 read raw features (a replica of
   the halo nodes' features made once at setup: input features never change), leaves of blocks
   1..L-2 read the quantized histories h^(k) (history.py, through the machine's own graph
   server: loopback, no wire).
2. The leaves of the top block (the seeds' remote neighbours) are *roots*: deduplicated and
   grouped by owner, one ask (compute.Roots) per owner machine, all in flight together: one
   round per batch (engine.Owners.ask). The owner (compute.Owner.answer) builds the same kind
   of graph for layers 1..L-1 below them on its own partition, reads its halo leaves from its
   histories, runs its model replica and answers h^(L-1) of the roots (compute.Rows),
   encoded by the run's codec (codec.py: `pipeline.codec` at `pipeline.bits`).
3. The trainer runs the L layers through its DDP wrapper; owner answers and history rows are
   constants (`pipeline.grad=stop`, GAS semantics): the gradient flows through the trainer's
   own sub-graph only, and DDP all-reduces it as in distdgl.
4. Fresh h^(1..L-1) of the batch's own nodes are pushed to the machine's histories (owners
   write theirs back too), only for *boundary* nodes (own nodes other machines hold as halo
   nodes: the only own rows anyone reads, through the halo sync). Every `weight_sync_steps`
   steps the trainer ships the layers below the top to its own machine's owner (its graph
   server(s), or its own process): every machine has a trainer holding the same DDP weights,
   so owners never need weights from another machine (no wire). Every
   `halo_sync_steps` steps each machine pulls halo history rows from their owners (encoded as
   stored, with their stamps): with `pipeline.sync_budget=r` (default 0.25) as many rows as r x
   the LAMP answer rows its trainer received since the last sync, those refreshed longest ago
   first (a round robin over tables and halo nodes); with `sync_budget=null` every halo row
   written since the last sync (halo.py).

5. The asynchronous pipeline (`pipeline.prefetch=k`, pipeline.py `pipelined`): steps 1-2 of
   batch i+k run before batch i trains, so the owners prepare while the trainer computes; the
   pushes, weights and halo sync of step 4 are sent without waiting and collected a step later.
   Answers of several batches in flight are routed by sequence number (service.receive) or
   come back in round order (owners.TrainerOwners). What
   this costs: the owners answer with weights up to k (+ weight_sync_steps) steps older, and
   history rows are up to k steps older; both are measured (`owner_version_lag_*`,
   `history_age_*`).
6. Two-level fusion (`pipeline.fusion`, graph.py, compute.py): every computation graph is a
   layered DAG, each (node, layer) computed once (level 2), and an owner merges every LAMP
   ask queued for it (a server: other trainers', prefetched batches'; a trainer: every peer's
   ask of the round) into one graph (level 1).
   fusion=false computes every path of every request on its own (graph.unfold), the ablation.

Histories are initialised with one layer-wise inference pass through the history layers (the
evaluator's whole-graph pass, `DistEvaluator.inference(layers)`, computes those layers' outputs
for every node; a 2-layer model has no history and skips it). Evaluation is the evaluator's, as
for distdgl. The halo nodes' features are copied once at set-up, into memory or, with
`pipeline.halo_store=disk`, into a memory-mapped file the kernel may page out; with
`pipeline.halo_bits=8` (or 16) they are stored rounded by the run's codec (per-row 8-bit codes,
stochastic rounding as for the histories), a quarter of the bytes; `pipeline.history_store=disk`
maps the history tables from files too. Histories and halo features serve training only:
they are freed before the final evaluation (`training_done`).

Choices where the paper is silent (docs/background.md, "LAMP (DEGNN)"), and why:
* Histories keep h^(1..L-2) only (GAS keeps L-1 tables): a remote node's h^(L-1) is always
  prepared fresh by its owner, so that table would never be read; a 2-layer model has no
  history at all (nothing to push or synchronise). The ablation `pipeline.roots=histories` (what
  the owners' fresh answers add) keeps h^(L-1) too and reads the roots from it instead of asking
  their owners: that table is initialised, pushed for boundary nodes and refreshed by the halo
  sync like the others (the budget then counts the roots read), and a batch asks nothing of other
  machines but the halo sync.
* The halo sync has a byte budget (`pipeline.sync_budget`), not only a period. Syncing every
  changed halo row moves |halo| x (L-2) rows per `halo_sync_steps` steps: on synthetic-arxiv (23k halo
  nodes a machine) ten times the per-batch LAMP traffic at 3 layers and twice that at 4, so the
  bytes would grow with the layers after all: syncing every changed boundary row every R steps
  costs O(|boundary| (L-1) d_h b / R) bytes a step. With a budget of r x the answer rows the sync
  adds at most r to the LAMP traffic whatever L is; the price is older halo rows (each row comes
  back after (L-2) |halo| / (r x roots per step) steps, a few epochs here, GAS's regime: its
  histories of out-of-batch nodes are up to an epoch old), measured as `history_age_*`. Oldest
  first rather than most-changed first (a Sancus-style drift rule): with sampled neighbourhoods
  every recomputed row drifts, so a drift threshold would skip little, and oldest first needs no
  state at the owners (the subscriber knows when it last got each row).
* Owners answer per-root h^(L-1) (not per-seed partial sums): works for every aggregator
  (GAT too) and the bytes are |roots| x (d_h b/8 + 4), independent of L and lower fan-outs.
* Gradient: stop (GAS, default) or push (P3-style, `pipeline.grad=push`): the trainer sends the
  gradient rows of the owners' answers back (quantized like the answers); the owner recomputes
  its graph below those roots with autograd (a fresh sample with its current weights: servers
  keep no per-request autograd state) and keeps the lower layers' parameter gradients until its
  machine's trainer pulls them (loopback, in the background) into its next all-reduce. So they
  join one step late (or more), and only the owner machine's trainer's all-reduce carries them:
  no parameter gradients on the wire.
* Where the owners' preparation runs (`pipeline.engine`, owners.make_owners): in the graph
  servers (server, service.py, over DGL RPC), or in each machine's trainer process (trainer, the
  default, owners.py): its histories, halo features and a model replica live in the machine's
  first trainer (local rank 0), and one round per batch (torch.distributed all_to_all on its own
  gloo group, in a background thread) carries the roots to their owners' trainers, the halo-sync
  asks and the pushed gradient rows, and brings the answers back; the machine's other trainers
  (`cluster.trainers_per_machine` > 1: they share its partition) send their history pushes and
  middle-block reads to that owner in the same rounds (loopback). No weights cross a process
  boundary; every round merges all trainers' requests. The price is lockstep: a round waits for
  every trainer to send its asks. Measured here the two tie within run-to-run spread, the trainer
  engine ahead by 3-5% in pooled medians (benchmarks/RESULTS.md), so it is the default.
* Owner-side computation runs in eval mode (no dropout): answers stand in for historical
  embeddings, which should be expectations.
* Halo input features are replicated once at setup (counted in `setup_bytes`): block 0 of an
  own node needs its halo neighbours' raw features, and they never change.
* Quantization with stochastic rounding happens on every write (histories, answers); the
  halo sync moves stored rows unchanged (no second rounding). One codec (codec.py) encodes
  every row; everything else holds its rows as one opaque value.

Bytes (ByteCounter categories, only what crosses machines): lamp_request, lamp_response,
history_sync, allreduce. Loopback traffic to the machine's own server (weights, history push/pull,
setup) is reported apart in `local_bytes_by_category`: it never reaches the wire counters.

Files: pipeline.py (the trainer's loop: `train_epoch` -> `pipelined` -> `_issue` / `_complete`,
then `_after_step`; no engine branch: it talks to one `Owners`), engine.py (the `Owners`
interface, its Ticket and Answers, LampServiceError), owners.py (`make_owners` and engine=trainer's
rounds), service.py (engine=server: the graph servers' DGL RPC requests, their state, request
merging, the trainer's send/receive routing, `ServerOwners`), compute.py (the messages, a small
dataclass each, and what an owner does with them), graph.py (the computation-graph builder, fusion
counts and the unfolded graph), halo.py (the halo sync's plan and bookkeeping), history.py (the
history tables), codec.py (how rows are encoded: `pipeline.codec`), quantize.py (the min-max
quantizer's arithmetic), summary.py (LAMP's summary keys). This package imports nothing heavy
itself: graph servers import service.py (and through it engine.py, compute.py) before
`dgl.distributed.initialize` (degnn.runtime.services).
"""
from __future__ import annotations


def __getattr__(name):
    if name in ("LAMPPipeline", "LampNet"):
        from degnn.pipelines.lamp import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)
