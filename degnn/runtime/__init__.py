"""Per-process runtime helpers below the pipelines: DGL + torch.distributed initialisation
(store.py, compat.py, rendezvous.py), the run context, checkpoints, heartbeats, the RPC service
registry and the cluster's machine list. The process entry that uses them sits above the
pipelines (degnn/entry.py).
"""
