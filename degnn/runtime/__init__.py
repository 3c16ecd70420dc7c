"""Per-process runtime: role dispatch, DGL + torch.distributed initialisation (entry.py)."""
