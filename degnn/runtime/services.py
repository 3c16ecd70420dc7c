"""degnn's DGL RPC services, registered in every process (servers and trainers) before
`dgl.distributed.initialize()`: a server only answers requests of services it registered, and a
client only decodes responses of services it registered.

Registration is explicit: `register_all()` imports every module in SERVICE_MODULES (each holds a
`SERVICES` list of (service_id, request_class, response_class)), so a server knows every
pipeline's services although it never imports the pipelines themselves. The modules must import
cheaply (dgl and torch only).

Service ids are chosen far from DGL's own (6657-6662, 901231-901240).
"""
from __future__ import annotations

import importlib

# modules that define services (their `SERVICES` lists)
SERVICE_MODULES = ["degnn.pipelines.tma.service", "degnn.pipelines.lamp.service"]

# (service_id, request_class, response_class) defined outside SERVICE_MODULES (tests)
SERVICES: list = []


def all_services() -> list:
    out = list(SERVICES)
    for name in SERVICE_MODULES:
        out += list(importlib.import_module(name).SERVICES)
    ids = [sid for sid, _, _ in out]
    if len(ids) != len(set(ids)):
        raise RuntimeError(f"two degnn RPC services share an id: {sorted(ids)}")
    return out


def register_all() -> None:
    import dgl.distributed

    for service_id, req, res in all_services():
        dgl.distributed.register_service(service_id, req, res)
