"""Who may call what under mutual TLS: full gRPC method name -> the roles whose certificates may call it.

The hosts' own methods are listed here (services.proto says who calls what); a protocol's methods join
from their ``@handles`` declarations (vflnet/sdk/contract.py), built-in or plug-in alike. The role
authorizer (vflnet/wire/tls.py) refuses a method that is not here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    "/vflnet.v1.Coordinator/Join": frozenset({"active", "passive"}),
    "/vflnet.v1.Party/Align": frozenset({"coordinator"}),
    "/vflnet.v1.Party/RunStep": frozenset({"coordinator"}),
    "/vflnet.v1.Party/Shutdown": frozenset({"coordinator"}),
    "/vflnet.v1.Party/ReleaseModel": frozenset({"coordinator"}),
    "/vflnet.v1.Party/ReceiveModel": frozenset({"active", "passive"}),
    "/vflnet.v1.Coordinator/ReceiveModel": frozenset({"active", "passive"}),
}


def register_permissions(permissions: Mapping[str, Iterable[str]]) -> None:
    """Add a protocol's methods (full name -> roles); a method two protocols serve keeps the union."""
    for method, roles in permissions.items():
        ROLE_PERMISSIONS[method] = ROLE_PERMISSIONS.get(method, frozenset()) | frozenset(roles)
