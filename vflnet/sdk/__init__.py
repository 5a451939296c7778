"""The plug-in SDK: the one module a protocol imports (docs/architecture.md, "Writing a protocol").

A protocol is a registered ``Protocol`` naming its three sides (``contract``); each side sees its
role process through a typed context (``context``); its service methods are marked ``@handles`` and
its calls go out through ``send`` or ``call`` (``handlers``), so the host checks, meters and answers
with a status, and the protocol never touches gRPC: it fails a request with ``invalid``,
``malformed``, ``wrong_state``, ``stale_step``, ``duplicate``, ``not_found`` or ``aborted``, each a
gRPC status. A side that gathers every sender's message for a step and answers each keeps them in a
``StepMailbox`` (``mailbox``). Defenses enter a side through ``attach`` (at one of ``HOOK_POINTS``), typed per hook point
(``attach_labels``, ``attach_scores``, ``attach_upload``; ``attach_bottom`` is the host's);
what a side hands its party's attacks are the views (``OwnStepView``, ``PredictionView``); tensors
cross the wire through ``to_proto`` / ``from_proto`` (and the tensor-map and +-1 forms); a side's
model is its host's ``LocalModel`` (``TopModel``, ``aggregate``; ``build_optimizer``,
``build_schedule`` for one of its own), an active side's label defense a ``LabelDefense``; a file a
side writes goes through ``write_durable`` (whole or not at all, a failure named). ``deadlines`` estimates a side's work per step. The hosts' plumbing
(vflnet/interceptors/bridge.py, vflnet/wire/checks.py) is not part of it.
"""

from vflnet.config import Config
from vflnet.defenses.base import (
    HOOK_POINTS,
    BottomWrap,
    ScoreTransform,
    UploadTransform,
    attach,
    attach_bottom,
    attach_labels,
    attach_scores,
    attach_upload,
)
from vflnet.defenses.label_defenses import LabelDefense, soft_cross_entropy
from vflnet.durable import write_durable
from vflnet.models.local import LocalModel
from vflnet.models.optim import build_optimizer, build_schedule
from vflnet.models.zoo import TopModel, aggregate
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
from vflnet.threat.attack import OwnStepView, PredictionView
from vflnet.v1.messages_pb2 import EVAL, PREDICT, TRAIN, Header, JoinReply, StepCommand, StepReport
from vflnet.wire.channels import MessageTooLarge
from vflnet.wire.errors import (
    aborted,
    duplicate,
    invalid,
    malformed,
    not_found,
    shown,
    stale_step,
    wrong_state,
)
from vflnet.wire.tensors import (
    PayloadError,
    from_pm1_proto,
    from_proto,
    from_tensor_map,
    to_pm1_proto,
    to_proto,
    to_tensor_map,
)

__all__ = [
    "EVAL",
    "HOOK_POINTS",
    "HOST_METHODS",
    "PREDICT",
    "PROTOCOLS",
    "TRAIN",
    "BottomWrap",
    "Config",
    "CoordinatorContext",
    "CoordinatorSide",
    "Header",
    "JoinReply",
    "LabelDefense",
    "LocalModel",
    "MessageTooLarge",
    "OwnStepView",
    "Param",
    "PartyContext",
    "PartySide",
    "PayloadError",
    "Pending",
    "PredictionView",
    "Protocol",
    "RunFailed",
    "ScoreTransform",
    "StepCommand",
    "StepMailbox",
    "StepReport",
    "TopModel",
    "UploadTransform",
    "aborted",
    "aggregate",
    "attach",
    "attach_bottom",
    "attach_labels",
    "attach_scores",
    "attach_upload",
    "build_optimizer",
    "build_schedule",
    "call",
    "check_and_meter",
    "duplicate",
    "from_pm1_proto",
    "from_proto",
    "from_tensor_map",
    "handles",
    "invalid",
    "malformed",
    "not_found",
    "register_messages",
    "send",
    "shown",
    "soft_cross_entropy",
    "stale_step",
    "to_pm1_proto",
    "to_proto",
    "to_tensor_map",
    "write_durable",
    "wrong_state",
]
