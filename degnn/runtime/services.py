"""degnn's DGL RPC services, registered in every process (servers and trainers) before
`dgl.distributed.initialize()`: a server only answers requests of services it registered, and a
client only decodes responses of services it registered.

Which modules define services comes from the configuration: `pipeline.services` (a list of module
names in conf/pipeline/<name>.yaml), each module holding a `SERVICES` list of (service_id,
request_class, response_class). Servers and trainers compose the same config, so both register the
same services, and this module never names a pipeline. The modules must import cheaply (dgl and
torch only): a server imports them before it serves.

Service ids are chosen far from DGL's own (6657-6662, 901231-901240).
"""
from __future__ import annotations

import importlib
from typing import Iterable


def all_services(modules: Iterable[str]) -> list:
    """Every (service_id, request_class, response_class) of these modules; ids must be unique."""
    out = []
    for name in modules:
        try:
            module = importlib.import_module(str(name))
        except ImportError as e:
            raise RuntimeError(f"pipeline.services names {name}, which does not import ({e}): "
                               f"fix the module name in conf/pipeline/") from None
        if not hasattr(module, "SERVICES"):
            raise RuntimeError(f"pipeline.services names {name}, which defines no SERVICES list: "
                               f"remove it from conf/pipeline/ or add the list")
        out += list(module.SERVICES)
    ids = [sid for sid, _, _ in out]
    if len(ids) != len(set(ids)):
        raise RuntimeError(f"two degnn RPC services share an id: {sorted(ids)}; give each its own id")
    return out


def register(modules: Iterable[str]) -> None:
    import dgl.distributed

    for service_id, req, res in all_services(modules):
        dgl.distributed.register_service(service_id, req, res)
