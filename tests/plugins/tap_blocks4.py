"""A chain gate of blocks of 4 steps (the bench's tap_ab, with blocks a short test run holds several of)."""

from vflnet.interceptors.chain import gate_chains
from vflnet.tools.bench.tap_ab import odd_blocks

gate_chains(__name__, odd_blocks(4))
