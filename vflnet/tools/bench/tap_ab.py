"""`vflnet bench goals`' in-run A/B of the trace tap, as a plug-in module: a run whose config lists it
under ``plugins:`` runs every party's chain on the steps of even blocks of :data:`BLOCKS` steps only,
and lets the odd blocks' messages by as a party without a chain would (a chain gate,
vflnet.interceptors.chain). Tapped and untapped steps then share the same processes and the same
load, and their difference is the tap's cost (goals.tap_ms).

Its traces hold half the steps: the bench runs it in a scratch folder that it removes with them, so no
trace of it is left for an attack or a score to take for the run's whole traffic; the config checks
refuse it beside an attack.
"""

from __future__ import annotations

from google.protobuf.message import Message

from vflnet.interceptors.chain import ChainGate, gate_chains
from vflnet.interceptors.events import header_of

BLOCKS = 20  # ~0.1 s a block: a load that comes and goes falls on both halves alike


def odd_blocks(blocks: int) -> ChainGate:
    """The gate that lets by the messages of the steps of odd blocks of ``blocks`` steps. The step is
    the header's: evaluation, prediction and model-release messages number their steps on the same
    counter and are let by alike; messages without a header (Join, Shutdown) always run the chain."""
    if blocks < 1:
        raise ValueError(f"blocks must be a positive number of steps, got {blocks}")

    def passes(message: Message) -> bool:
        header = header_of(message)
        return header is not None and (header.step // blocks) % 2 == 1

    return passes


gate_chains(__name__, odd_blocks(BLOCKS))
