"""degnn's models: the GNN stack and link model (gnn.py, on DGL's layers' parameters), the
plain-torch layers (torch_layers.py, no DGL) and the choice between them (backend.py).

The names below are imported from gnn.py on first use, so that `degnn.models.torch_layers` imports
where DGL is not installed (benchmarks/compute_speed.py on a GPU machine).
"""
EXPORTS = ("GNN", "KINDS", "LinkModel", "MLPDecoder", "build_link_model", "build_model", "check_model_config",
           "with_self_loops")


def __getattr__(name: str):
    if name in EXPORTS:
        from degnn.models import gnn

        return getattr(gnn, name)
    raise AttributeError(f"module 'degnn.models' has no attribute {name!r}")
