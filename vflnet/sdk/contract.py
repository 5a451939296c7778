"""The protocol plug-in API: what a protocol supplies to each role's host.

A role process is a generic host (vflnet/roles/): the coordinator admits the roster, aligns the
sample IDs, drives the seeded schedule (training steps, evaluation, prediction, model release) and
keeps the metrics; a party loads its own data, joins, checks every step command, meters, checkpoints
and serves. A protocol fills in what happens at each stage, per role, in three *sides*:

- ``CoordinatorSide``: its services (split-he: masked decryption), what the admission reply and each
  step command carry, what happens with the parties' step reports (param-server: apply uploads);
- ``PartySide`` for the active and for the passive role: its services (split: the active party's
  ExchangeEmbeddings), the party's work for one step command, what its step report carries, what its
  model release contains.

A protocol is one registered class naming its three sides (``@PROTOCOLS.register``, the registry of
vflnet/registry.py, which finds the built-ins in this package). A plug-in
protocol is a module listed under ``plugins:`` that registers one, plus its messages: it registers its
gRPC service descriptors with ``register_service`` so taps, traces and the role authorizer know them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from vflnet.config import TRAIN_KEYS
from vflnet.interceptors.events import register_service, short_name
from vflnet.registry import PROTOCOLS, Param
from vflnet.sdk.handlers import handlers_of, serve_handlers
from vflnet.v1 import messages_pb2, tensor_pb2
from vflnet.wire.chunking import register_chunkable
from vflnet.wire.permissions import register_permissions

if TYPE_CHECKING:
    from vflnet.config import Config
    from vflnet.interceptors.bridge import Server
    from vflnet.models.local import LocalModel
    from vflnet.sdk.context import CoordinatorContext, PartyContext


# The methods the generic hosts serve under every protocol (vflnet/roles/): admission, model release to
# the coordinator, and every party's step, shutdown and model release.
HOST_METHODS = frozenset(
    {
        "/vflnet.v1.Coordinator/Join",
        "/vflnet.v1.Party/Align",  # the alignment phase (vflnet/roles/alignment.py)
        "/vflnet.v1.Coordinator/ReceiveModel",
        "/vflnet.v1.Party/RunStep",
        "/vflnet.v1.Party/Shutdown",
        "/vflnet.v1.Party/ReleaseModel",
        "/vflnet.v1.Party/ReceiveModel",
    }
)


class RunFailed(RuntimeError):
    """The run cannot go on (a party failed a step, a bad upload): the coordinator stops it."""


class CoordinatorSide:
    """The coordinator's half. The defaults do nothing: the generic schedule is the whole protocol."""

    # Whether step n+1's command may go out before step n's reports are in (vflnet/roles/step_order.py).
    # Safe when every party's part of a step happens in its own step, in order, and ``command`` and
    # ``after_step`` keep no state that step n+1 would need from step n (split: yes; split-he's
    # decryption is bound to the one step in flight, param-server's command carries the parameters
    # step n updates, secureboost's passive parties work in their services).
    pipelined: ClassVar[bool] = False

    def __init__(self, host: CoordinatorContext) -> None:
        self.host = host
        self.cfg = host.cfg

    def add_services(self, server: Server) -> None:
        """Serve this side's ``@handles`` methods, wrapped with the host's checks (vflnet/sdk/handlers.py)."""
        serve_handlers(server, self, self.host)

    def join_reply(self, reply: messages_pb2.JoinReply) -> None:
        """Fill in what every party learns on admission beyond roster and IDs (split-he: the public key)."""

    def start(self, joined: dict[str, messages_pb2.JoinRequest]) -> None:
        """The roster is complete; ``joined`` holds every party's join request."""

    def waves(self, parties: list[str]) -> list[list[str]]:
        """The order of a step's RunStep calls: each wave is sent at once, the next when every report
        of it is in. By default one wave: every party at once."""
        return [parties]

    def command(self, party: str, cmd: messages_pb2.StepCommand) -> messages_pb2.StepCommand:
        """The step command as it goes to ``party`` (param-server: with its parameters)."""
        return cmd

    def after_step(self, phase: int, reports: dict[str, messages_pb2.StepReport]) -> None:
        """Every party answered the step (param-server: apply the uploaded gradients)."""

    @property
    def model_version(self) -> int:
        """Updates applied to parameters the coordinator holds (the header's model_version)."""
        return 0

    def state_dict(self) -> dict[str, Any]:
        """What a coordinated checkpoint keeps of this side (param-server: parameters and optimizers)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()`` (a resumed run; called after ``start``)."""

    def finish(self) -> dict[str, Any]:
        """The run completed: save what the coordinator holds; return entries for summary.json."""
        return {}


class PartySide:
    """One party's half (active or passive)."""

    def __init__(self, host: PartyContext) -> None:
        self.host = host
        self.cfg = host.cfg

    def make_local(self, modules: dict[str, Any]) -> LocalModel:
        """The party's trainable state: by default it owns its optimizer and LR schedule."""
        from vflnet.models.local import LocalModel

        return LocalModel(modules, self.cfg.train.optimizer, self.cfg.train.lr_schedule)

    def join_request(self, req: messages_pb2.JoinRequest) -> None:
        """Add to the join request (param-server: the freshly initialised parameters)."""

    def add_services(self, server: Server) -> None:
        """Serve this side's ``@handles`` methods, wrapped with the host's checks (vflnet/sdk/handlers.py)."""
        serve_handlers(server, self, self.host)

    def joined(self, reply: messages_pb2.JoinReply) -> None:
        """Admission is done (roster, IDs, the protocol's fields of the reply): open channels to peers."""

    def step_work_s(self) -> float:
        """Seconds of compute of this party's heaviest step on the reference core, for the step deadline
        (vflnet/sdk/deadlines.py); by default a forward and backward pass of its modules over the
        run's largest batch. A protocol with cryptography adds its cost."""
        from vflnet.sdk import deadlines

        host = self.host
        shape = tuple(host.data.x.shape[1:]) if host.data.x is not None else None
        flops = sum(
            deadlines.forward_flops(m, shape if k == "bottom" else None)
            for k, m in host.local.modules.items()
        )
        return deadlines.training_s(flops, deadlines.largest_batch(self.cfg))

    def step(self, cmd: messages_pb2.StepCommand, rows: np.ndarray) -> dict[str, float]:
        """This party's work for one checked step command (train, eval or predict); returns its metrics.
        ``rows`` are the command's samples as row indices into the party's data."""
        raise NotImplementedError

    def report(self, cmd: messages_pb2.StepCommand, report: messages_pb2.StepReport) -> None:
        """Add to the step report before it is metered and sent (param-server: the gradient upload)."""

    def release(self, modules: list[str]) -> tuple[tensor_pb2.TensorMap, dict[str, Any]]:
        """The model parts handed over in a model release: parameters by name and a JSON spec."""
        from vflnet.wire.tensors import to_tensor_map

        local = self.host.local
        params = {
            f"{k}.{n}": v.detach().cpu().numpy()
            for k in modules
            for n, v in local.modules[k].state_dict().items()
        }
        spec = {k: self.host.model_spec(k) for k in modules}
        return to_tensor_map(params), spec

    def checkpoint(self, path: Path) -> None:
        """The party's final model at shutdown (by default its trainable state), atomically."""
        self.host.local.save(path)

    def state_dict(self) -> dict[str, Any]:
        """What a coordinated checkpoint keeps of this side beyond the host's model, optimizer and the
        seeded generators reachable from the side (those the host saves itself)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()`` (a resumed run; called after ``joined``)."""

    def stop(self, reason: str) -> None:
        """The run is ending: release anything still waiting on a peer."""

    def finish(self) -> None:
        """At shutdown, under the step lock: write what the side keeps (active: predictions)."""


class Protocol:
    """A registered protocol: its name, settings and its three sides."""

    name: ClassVar[str]
    description: ClassVar[str]
    params: ClassVar[dict[str, Param]] = {}  # its `protocol.params` settings (plug-ins)
    coordinator: ClassVar[type[CoordinatorSide]] = CoordinatorSide
    active: ClassVar[type[PartySide]]
    passive: ClassVar[type[PartySide]]
    roles: ClassVar[frozenset[str]] = frozenset({"coordinator", "active", "passive"})  # for `describe`
    resumable: ClassVar[bool] = True  # its sides keep all their state in state_dict (`vflnet run --resume`)
    # The defense hook points its sides apply (a defense's `acts_on`): "labels" (the active party's label
    # defense on its loss, gradients and predictions), "bottom" (a passive party's bottom replaced or
    # wrapped), "scores" (released confidence vectors, PREDICT phase), "upload" (the gradient upload),
    # "plaintext-embeddings" (the active party computes on the passive parties' embeddings in the clear:
    # a defense's ``requires``; the one list: ``vflnet.defenses.base.HOOK_POINTS``, checked when the
    # protocol registers); config validation refuses a defense whose hook points are not all here,
    # and ``vflnet.defenses.base.attach`` applies them.
    defense_hooks: ClassVar[frozenset[str]] = frozenset()
    # The full gRPC method names its sides serve beyond the hosts' (HOST_METHODS): their ``@handles``
    # methods, gathered when the class is defined; with HOST_METHODS, the methods an attack's taps and
    # rewrites may name (config validation refuses any other).
    methods: ClassVar[frozenset[str]] = frozenset()

    # who may call each of those methods (full name -> roles), from the same declarations
    callers: ClassVar[dict[str, frozenset[str]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Gather the sides' ``@handles`` declarations: the method table, and who may call each method
        under mutual TLS (one declaration, on the handler)."""
        super().__init_subclass__(**kwargs)
        callers: dict[str, frozenset[str]] = {}
        for side in (
            getattr(cls, "coordinator", None),
            getattr(cls, "active", None),
            getattr(cls, "passive", None),
        ):
            if side is None:
                continue
            for spec in handlers_of(side).values():
                callers[spec.method] = callers.get(spec.method, frozenset()) | spec.callers
        if callers:
            register_permissions(callers)
            cls.callers = callers
            cls.methods = cls.methods | frozenset(callers)

    @classmethod
    def method_names(cls) -> list[str]:
        """The short names of every method that crosses the wire in a run of this protocol."""
        return sorted({short_name(m) for m in HOST_METHODS | cls.methods})

    # The shared `protocol:` settings its sides read besides `kind` and `params` (`aggregation`, `static`,
    # `he`); config validation refuses one set away from its default under a protocol that does not.
    settings: ClassVar[frozenset[str]] = frozenset()

    # The `train:` keys its sides and the generic hosts read under it (a subsection, `optimizer` or
    # `lr_schedule`, as a whole): by default all, as the hosts' schedule and ``PartySide.make_local`` read
    # them. A protocol that trains no optimizer (secureboost) leaves those out; config validation refuses
    # a `train:` key set under a protocol that does not list it (`vflnet.config.unread_keys`).
    train_reads: ClassVar[frozenset[str]] = TRAIN_KEYS

    # The knowledge kinds its sides deliver to attacks (vflnet/threat/knowledge.py, ``by_protocol``):
    # config validation refuses an attack that needs one its run's protocol does not list here.
    provides: ClassVar[frozenset[str]] = frozenset()

    # its party sides move tensors to the party's device (`train.device`); others train on the CPU only
    trains_on_device: ClassVar[bool] = False

    @classmethod
    def check_config(cls, cfg: Config) -> list[tuple[str, str]]:
        """Problems with a run config under this protocol, as (key, message)."""
        return []

    @classmethod
    def side(cls, role: str) -> type[PartySide]:
        return cls.active if role == "active" else cls.passive


def register_messages(service: Any) -> None:
    """Make a plug-in protocol's gRPC service known (its protobuf ServiceDescriptor): its methods'
    messages (for taps, traces and the handlers), and that they travel in chunks and through the
    parties' mod chains like vflnet's own. Who may call each method comes from its ``@handles``."""
    register_service(service)
    register_chunkable(service)


__all__ = ["PROTOCOLS", "CoordinatorSide", "PartySide", "Protocol", "RunFailed", "register_messages"]
