"""The plug-in SDK: the one module a protocol imports (docs/architecture.md, "Writing a protocol").

A protocol is a registered ``Protocol`` naming its three sides (``contract``); each side sees its
role process through a typed context (``context``); its service methods are marked ``@handles`` and
its calls go out through ``send`` or ``call`` (``handlers``), so the host checks, meters and answers
with a status, and the protocol never touches gRPC: it fails a request with ``invalid``,
``malformed``, ``wrong_state``, ``stale_step``, ``duplicate``, ``not_found`` or ``aborted``, each a
gRPC status. A side that gathers every sender's message for a step and answers each keeps them in a
``StepMailbox`` (``mailbox``). ``deadlines`` estimates a side's work per step. The hosts' plumbing
(vflnet/interceptors/bridge.py, vflnet/wire/checks.py) is not part of it.
"""

from vflnet.models.zoo import aggregate
from vflnet.registry import Param
from vflnet.sdk.context import CoordinatorContext, PartyContext
from vflnet.sdk.contract import (
    HOST_METHODS,
    PROTOCOLS,
    CoordinatorSide,
    PartySide,
    Protocol,
    RunFailed,
    register_messages,
)
from vflnet.sdk.handlers import Pending, call, check_and_meter, handles, send
from vflnet.sdk.mailbox import StepMailbox
from vflnet.v1.messages_pb2 import EVAL, PREDICT, TRAIN, Header, JoinReply, StepCommand, StepReport
from vflnet.wire.errors import aborted, duplicate, invalid, malformed, not_found, stale_step, wrong_state
from vflnet.wire.tensors import from_proto, to_proto

__all__ = [
    "EVAL",
    "HOST_METHODS",
    "PREDICT",
    "PROTOCOLS",
    "TRAIN",
    "CoordinatorContext",
    "CoordinatorSide",
    "Header",
    "JoinReply",
    "Param",
    "PartyContext",
    "PartySide",
    "Pending",
    "Protocol",
    "RunFailed",
    "StepCommand",
    "StepMailbox",
    "StepReport",
    "aborted",
    "aggregate",
    "call",
    "check_and_meter",
    "duplicate",
    "from_proto",
    "handles",
    "invalid",
    "malformed",
    "not_found",
    "register_messages",
    "send",
    "stale_step",
    "to_proto",
    "wrong_state",
]
