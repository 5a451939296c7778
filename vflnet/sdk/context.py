"""What a protocol side may use of the role process that hosts it: typed contexts, not the raw host.

The hosts (vflnet/roles/) satisfy these structurally; a side is written against the context, so a
protocol never depends on a role module and a host's other state (its step lock, reply cache,
liveness, bridge) stays the host's own.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import grpc

    from vflnet.config import Config, PartyConfig
    from vflnet.data.partition import PartyData
    from vflnet.models.local import LocalModel
    from vflnet.threat.interception import PartyInterception
    from vflnet.v1 import messages_pb2
    from vflnet.wire.checks import JoinWaitroom
    from vflnet.wire.meter import Meter


class CoordinatorContext(Protocol):
    """The coordinator process, as its protocol side sees it."""

    cfg: Config
    name: str
    run_dir: Path | None
    interception: PartyInterception  # its attacks' chain and knowledge (the coordinator may host attacks)


class PartyContext(Protocol):
    """A party process, as its protocol side sees it."""

    cfg: Config
    name: str
    role: str
    me: PartyConfig  # this party's block of the run config
    run_dir: Path
    log: logging.Logger
    data: PartyData  # its own rows: features, labels where it holds them, sample IDs
    local: LocalModel  # its trainable modules and optimizer
    meter: Meter  # bytes on the wire by message, for the run's summary
    interception: PartyInterception  # its attacks' chain and knowledge
    ready: threading.Event  # set once admitted
    waitroom: JoinWaitroom  # where a peer's message waits until this party is admitted
    join_reply: messages_pb2.JoinReply  # roster, IDs and the protocol's fields of the admission
    current: messages_pb2.Header  # the step being worked on
    coordinator_channel: grpc.Channel | None

    @property
    def step_deadline_s(self) -> float:
        """The deadline of every call and wait within a step."""
        ...

    def header(self, h: messages_pb2.Header) -> messages_pb2.Header:
        """The header of a message this party sends within the step of ``h``."""
        ...

    def channel(self, address: str, peer: str) -> grpc.Channel:
        """A client channel to roster party ``peer``, with this party's interceptor chain on it."""
        ...

    def model_spec(self, module: str) -> dict[str, object]:
        """A module's architecture as the run config gives it (for a model release)."""
        ...
