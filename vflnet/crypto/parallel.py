"""Opt-in process pool for the engine's big-integer work (`workers` > 1).

gmpy2 arithmetic holds the GIL, so parallelism needs processes. Pools use the "spawn" start method:
party processes run gRPC threads, and forking a threaded process is unsafe. A pool is created on
first use for each worker count and reused; `shutdown_pools` ends them.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

_POOLS: dict[int, ProcessPoolExecutor] = {}


def _pool(workers: int) -> ProcessPoolExecutor:
    pool = _POOLS.get(workers)
    if pool is None:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        _POOLS[workers] = pool
    return pool


def shutdown_pools() -> None:
    """Stop every pool this process started."""
    for pool in _POOLS.values():
        pool.shutdown(wait=True)
    _POOLS.clear()


def split_ranges(total: int, parts: int) -> list[tuple[int, int]]:
    """Split range(total) into at most `parts` contiguous, non-empty, near-equal pieces."""
    parts = max(1, min(parts, total))
    step, extra = divmod(total, parts)
    ranges, start = [], 0
    for i in range(parts):
        stop = start + step + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def run_chunks(fn: Callable[..., Any], chunks: Sequence[tuple[Any, ...]], workers: int) -> list[Any]:
    """fn(*chunk) for every chunk, in order; in a process pool when workers > 1."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(chunks) <= 1:
        return [fn(*chunk) for chunk in chunks]
    pool = _pool(workers)
    futures = [pool.submit(fn, *chunk) for chunk in chunks]
    return [f.result() for f in futures]
