"""Model release, the recipient's side: the threat model's ``released_model`` knowledge arrives here.

A release is accepted only where the run config grants it (``model_release``: owner, recipient,
modules); its parameters and spec reach the recipient's attacks and nothing else.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import grpc

from vflnet.config import Config
from vflnet.v1 import messages_pb2
from vflnet.wire.checks import check_run, check_sender
from vflnet.wire.errors import RpcFailure, shown
from vflnet.wire.tensors import from_tensor_map

log = logging.getLogger(__name__)


def accept_release(
    cfg: Config, name: str, msg: messages_pb2.ModelRelease, context: Any, knowledge: dict[str, Any]
) -> None:
    """A recipient's side of a model release: only a release the run config grants is accepted, and it
    reaches the recipient's attacks as the ``released_model`` knowledge {owner: {module.param: array,
    "spec": {...}}}."""
    h = msg.header
    check_run(cfg, h.run_id)
    check_sender(cfg, h.sender, {"active", "passive"}, context)
    granted = {m for r in cfg.model_release if r.owner == h.sender and r.recipient == name for m in r.modules}
    if not granted or not set(msg.modules) <= granted:
        raise RpcFailure(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{name} is granted {sorted(granted) or 'no'} modules of {h.sender}'s model, "
            f"got {shown(', '.join(msg.modules))}",
        )
    try:
        params = from_tensor_map(msg.parameters, f"{h.sender}'s released parameter")
        spec = json.loads(msg.spec) if msg.spec else {}
    except ValueError as exc:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"malformed model release: {exc}") from exc
    knowledge.setdefault("released_model", {})[h.sender] = {"parameters": params, "spec": spec}
    log.info("%s received %s of %s's model", name, list(msg.modules), h.sender)
