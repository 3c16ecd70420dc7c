"""degnn's DGL RPC services, registered in every process (servers and trainers) before
`dgl.distributed.initialize()`. Pipelines that push work to the servers add theirs here.

Service ids are chosen far from DGL's own (6657-6662, 901231-901240).
"""
from __future__ import annotations

# (service_id, request_class, response_class); filled by pipelines that define services
SERVICES: list = []


def register_all() -> None:
    import dgl.distributed

    for service_id, req, res in SERVICES:
        dgl.distributed.register_service(service_id, req, res)
