"""Wire interception: taps and rewrites as mods over vflnet messages, bound to real gRPC.

``events`` (what a mod sees), ``chain`` (the mod contract), ``grpc_adapters`` (server and client
interceptors), ``trace`` (the trace file format and its writer tap), ``trace_cli`` (``vflnet trace``).
"""

from vflnet.interceptors.chain import Chain, Filter, Mod, Refused
from vflnet.interceptors.events import METHODS, WireEvent
from vflnet.interceptors.grpc_adapters import (
    ClientChainInterceptor,
    ServerChainInterceptor,
    intercept_channel,
)
from vflnet.interceptors.trace import TraceError, TraceWriter, read_trace, trace_path

__all__ = [
    "METHODS",
    "Chain",
    "ClientChainInterceptor",
    "Filter",
    "Mod",
    "Refused",
    "ServerChainInterceptor",
    "TraceError",
    "TraceWriter",
    "WireEvent",
    "intercept_channel",
    "read_trace",
    "trace_path",
]
