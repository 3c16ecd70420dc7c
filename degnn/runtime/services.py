"""degnn's DGL RPC services, registered in every process (servers and trainers) before
`dgl.distributed.initialize()`: a server only answers requests of services it registered, and a
client only decodes responses of services it registered.

Which modules define services comes from the configuration: `pipeline.services` (a list of module
names in conf/pipeline/<name>.yaml), each module holding a `SERVICES` list of (service_id,
request_class, response_class). Servers and trainers compose the same config, so both register the
same services, and this module never names a pipeline. The modules must import cheaply (dgl and
torch only): a server imports them before it serves.

Service ids are chosen far from DGL's own (6657-6662, 901231-901240).

`MessageRequest` and `MessageResponse` are the shared idiom for a service's messages: one
dataclass per request (and per kind of answer), as degnn/pipelines/tma/service.py uses them.
"""
from __future__ import annotations

import importlib
import traceback
from dataclasses import dataclass, fields
from typing import Iterable

import torch
from dgl.distributed import rpc


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


# --- answering: an error is an answer --------------------------------------------------------------
def answer_or_error(request, server_state, answered=lambda result: result):
    """Every degnn request's `process_request`: `answered(request.process(server_state))`, or where
    that raises, `request.response_cls(error="<Request> on server: <Error>: <message>")`, the
    traceback in the server's log: DGL would otherwise kill the server and leave every trainer
    waiting for an answer."""
    try:
        return answered(request.process(server_state))
    except Exception as e:  # noqa: BLE001 - answered, not raised: the server must live on
        error = f"{type(request).__name__} on server: {type(e).__name__}: {e}"
        print(f"degnn service error: {error}\n{traceback.format_exc(limit=5)}", flush=True)
        return request.response_cls(error=error)


# --- one class per message ----------------------------------------------------------------------
# A service's requests and responses are dataclasses whose fields are the message: the RPC state
# is the fields in order, so tensors are top-level members that DGL ships as raw buffers (the
# rest is pickled). A request's `process(server_state)` runs in the server (DGL's
# `process_request`); an exception there is answered as the response's `error`, since DGL would
# otherwise kill the server and leave every trainer waiting.
def message_state(msg) -> tuple:
    """A dataclass message's fields, in order: its RPC state."""
    return tuple(getattr(msg, f.name) for f in fields(msg))


def set_message_state(msg, state) -> None:
    names = [f.name for f in fields(msg)]
    # DGL hands a one-element state back unwrapped
    values = (state,) if len(names) == 1 else tuple(state)
    if len(values) != len(names):
        raise ValueError(f"{type(msg).__name__}: {len(values)} values for fields {names}")
    for name, value in zip(names, values):
        setattr(msg, name, value)


def tensor_bytes(msg) -> int:
    """The bytes of a message's tensors (the pickled remainder is not counted)."""
    return sum(v.numel() * v.element_size() for v in message_state(msg) if isinstance(v, torch.Tensor))


@dataclass
class MessageResponse(rpc.Response):
    """Base of a dataclass response: `error` (empty: none) says why the server could not answer;
    a subclass's own fields follow it, each with a default (an error answer has only `error`)."""

    error: str = ""

    def __getstate__(self):
        return message_state(self)

    def __setstate__(self, state):
        set_message_state(self, state)


class MessageRequest(rpc.Request):
    """Base of a dataclass request: `process` answers it in the server, with an instance of
    `response_cls`; an exception becomes that response's `error`."""

    response_cls = MessageResponse

    def __getstate__(self):
        return message_state(self)

    def __setstate__(self, state):
        set_message_state(self, state)

    def process_request(self, server_state):
        return answer_or_error(self, server_state)

    def process(self, server_state):
        raise NotImplementedError
