"""The serve loop of a party process and its thin Party servicer."""

from __future__ import annotations

import logging

import grpc

from vflnet.interceptors.grpc_adapters import ServerChainInterceptor
from vflnet.roles.party import PartyBase
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire.channels import bind, make_server
from vflnet.wire.errors import servicer_method

log = logging.getLogger("vflnet.serve")


class PartyServicer(services_pb2_grpc.PartyServicer):
    def __init__(self, party: PartyBase) -> None:
        self.party = party

    @servicer_method
    def RunStep(self, request: messages_pb2.StepCommand, context: grpc.ServicerContext) -> messages_pb2.StepReport:
        return self.party.run_step(request)  # type: ignore[attr-defined]

    @servicer_method
    def Shutdown(self, request: messages_pb2.ShutdownRequest, context: grpc.ServicerContext) -> messages_pb2.ShutdownReply:
        return self.party.shutdown(request)


def serve_party(party: PartyBase, listen: str, coordinator: str, advertise: str) -> int:
    """Serve, join the run, and stay up until the coordinator says shutdown (or goes silent)."""
    cfg = party.cfg
    chain = party.interception.chain
    server = make_server(cfg.transport, party.name, [ServerChainInterceptor(chain, party.name)] if len(chain) else [])
    services_pb2_grpc.add_PartyServicer_to_server(PartyServicer(party), server)
    party.add_services(server)
    port = bind(server, listen, cfg.transport, party.name)
    server.start()
    host = (advertise or listen).rsplit(":", 1)[0]
    if host in ("0.0.0.0", "[::]", ""):
        host = "127.0.0.1"
    address = advertise if advertise and not advertise.endswith(":0") else f"{host}:{port}"
    log.info("%s (%s) serving on port %d, advertised as %s", party.name, party.me.role, port, address)
    try:
        party.join(coordinator, address)
    except RuntimeError as exc:
        log.error("%s", exc)
        server.stop(grace=0)
        return 2
    why = party.liveness.wait()
    if why != "shutdown":
        log.error("%s: stopping: %s", party.name, why)
    server.stop(grace=2).wait()
    return 0 if why == "shutdown" else 3
