"""Sample alignment as a phase on the wire, before training (docs/protocols.md, Alignment).

The coordinator drives it with ``Party/Align`` calls on the same channels, interceptors, traces and
chunking as the training messages; semi-honest parties and coordinator.

- ``plain``: each party offers its IDs; the coordinator intersects them.
- ``hashed``: each party offers SHA-256 of each ID; the coordinator intersects the digests (anyone
  holding a list of candidate IDs recovers the IDs by hashing them: the weak baseline).
- ``psi``: ECDH private set intersection. Each party hashes each ID to a Curve25519 point
  ``H(x)`` and offers ``H(x)^a`` under its secret scalar ``a`` (X25519, through `cryptography`'s
  OpenSSL); the coordinator relays each party's offer to every other party, which raises it to its
  own secret (``H(x)^(a b c)``, the same for every party holding ``x``: the exponents commute), and
  intersects the fully blinded sets. Under DDH the coordinator and an observer learn the set sizes
  and which positions match (the intersection size, and the sizes of every subset's intersection),
  never an ID.

Each party offers its set in a secret random order; the coordinator answers with the positions of the
offer in the intersection. Every party holds the same intersection, and numbers its rows in it by
their own IDs' order: the run's row indices 0..n-1, the same at every party, which the steps carry
from then on (the coordinator never learns which ID a row index stands for). A resumed run does not
align again: the coordinator keeps ``alignment.json``, each party ``alignment-<name>.npy``.
"""

from __future__ import annotations

import hashlib
import io
import json
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from vflnet.config import Config
from vflnet.data.partition import PartyData
from vflnet.durable import write_durable
from vflnet.sdk.contract import RunFailed
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire.errors import RpcFailure, describe_rpc_error

ALIGN = "/vflnet.v1.Party/Align"
POINT = 32  # bytes of a hashed ID or a group element
DOMAIN = b"vflnet-align-v1\x00"  # hash domain: the IDs' digests here are useless elsewhere


def id_bytes(key: Any) -> bytes:
    return str(key).encode()


def hashed(keys: np.ndarray) -> bytes:
    """``hashed``: SHA-256 of each ID, unsalted (that is the point: it is the shortcut that leaks)."""
    return b"".join(hashlib.sha256(id_bytes(k)).digest() for k in keys)


class Blinder:
    """A party's psi secret: ``H(x)^a`` on Curve25519's Montgomery line (X25519 with a clamped scalar:
    every result lies in a prime-order subgroup, and exponents commute)."""

    def __init__(self) -> None:
        self._key = X25519PrivateKey.generate()

    def point(self, element: bytes) -> bytes:
        try:
            return self._key.exchange(X25519PublicKey.from_public_bytes(element))
        except ValueError as exc:  # a small-order element: never from an honest party's hash
            raise ValueError("an element of low order") from exc

    def blind(self, keys: np.ndarray) -> bytes:
        return b"".join(self.point(hashlib.sha256(DOMAIN + id_bytes(k)).digest()) for k in keys)

    def reblind(self, items: bytes) -> bytes:
        return b"".join(self.point(items[i : i + POINT]) for i in range(0, len(items), POINT))


def _invalid(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, message)


class PartyAlignment:
    """A party's side of the phase: its offer, re-blinding others' offers, and its aligned rows."""

    def __init__(
        self,
        cfg: Config,
        name: str,
        data: PartyData,
        run_dir: Path,
        probes: Sequence[str] = (),
        on_aligned: Callable[[list[str]], None] | None = None,
    ) -> None:
        assert data.keys is not None
        if probes:
            data = padded(data, probes)
        self.on_aligned = on_aligned
        self.cfg, self.name, self.data, self.path = cfg, name, data, run_dir / f"alignment-{name}.npy"
        self.method = cfg.alignment.method
        self.order = np.random.default_rng(secrets.randbits(128)).permutation(len(data.keys))
        self.blinder = Blinder() if self.method == "psi" else None
        self.aligned: PartyData | None = None
        self.lock = threading.Lock()
        self.cpu_s = 0.0  # CPU seconds of the calls handled (`vflnet bench psi`)
        # psi: one re-blinding per other party's set, no more (the party is no unbounded blinding oracle)
        self.reblinds_left = sum(1 for p in cfg.parties if p.role != "coordinator") - 1

    def handle(self, req: messages_pb2.AlignRequest) -> messages_pb2.AlignReply:
        start = time.thread_time()
        try:
            return self._handle(req)
        finally:
            with self.lock:
                self.cpu_s += time.thread_time() - start

    def _handle(self, req: messages_pb2.AlignRequest) -> messages_pb2.AlignReply:
        keys = self.data.keys
        assert keys is not None
        if req.op == messages_pb2.ALIGN_OFFER:
            offered = keys[self.order]
            if self.method == "plain":
                return messages_pb2.AlignReply(keys=[str(k) for k in offered])
            if self.method == "hashed":
                return messages_pb2.AlignReply(items=hashed(offered))
            assert self.blinder is not None
            return messages_pb2.AlignReply(items=self.blinder.blind(offered))
        if req.op == messages_pb2.ALIGN_REBLIND:
            if self.blinder is None:
                raise _invalid(f"alignment.method is {self.method!r}: nothing to re-blind (psi only)")
            with self.lock:
                if self.reblinds_left <= 0 or self.aligned is not None:
                    raise RpcFailure(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        "every other party's set is re-blinded already: a party re-blinds each once",
                    )
                self.reblinds_left -= 1
            if len(req.items) % POINT:
                raise _invalid(f"re-blinding takes {POINT}-byte elements; got {len(req.items)} bytes")
            try:
                return messages_pb2.AlignReply(items=self.blinder.reblind(req.items))
            except ValueError as exc:
                raise _invalid(f"re-blinding refused: {exc}") from exc
        if req.op == messages_pb2.ALIGN_RESULT:
            return messages_pb2.AlignReply(
                count=self.result(np.asarray(req.positions, np.int64), req.n_common)
            )
        raise _invalid(f"unknown alignment step {req.op}")

    def result(self, positions: np.ndarray, n_common: int) -> int:
        n = len(self.order)
        if len(positions) != n_common:
            raise _invalid(f"{len(positions)} positions for {n_common} common samples")
        if len(positions) and (positions.min() < 0 or positions.max() >= n):
            raise _invalid(f"a position outside the {n} IDs offered")
        rows = np.sort(self.order[positions])  # the party's rows are sorted by ID: the run's order
        if len(np.unique(rows)) != len(rows):
            raise _invalid("a position is named twice")
        with self.lock:
            if self.aligned is not None:
                raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, "the samples are aligned already")
            self.aligned = aligned_view(self.data, rows)
        buffer = io.BytesIO()
        np.save(buffer, rows)
        write_durable(self.path, buffer.getvalue(), "this party's alignment")  # a resumed run reads it
        with self.lock:
            usage = {"offered": n, "aligned": len(rows), "cpu_s": self.cpu_s}
        write_durable(self.path.with_suffix(".json"), json.dumps(usage).encode(), "the alignment's usage")
        if self.on_aligned is not None:
            self.on_aligned([str(k) for k in self.data.keys[rows]])  # type: ignore[index]
        return len(rows)

    def resumed(self, n_common: int) -> PartyData:
        """A resumed run: the rows this party aligned before (the run does not align again)."""
        if not self.path.exists():
            raise RuntimeError(f"{self.name}: cannot resume: no {self.path.name} (this party's alignment)")
        rows = np.load(self.path)
        if len(rows) != n_common:
            raise RuntimeError(
                f"{self.name}: cannot resume: {self.path.name} holds {len(rows)} rows, not {n_common}"
            )
        return aligned_view(self.data, rows)


def padded(data: PartyData, probes: Sequence[str]) -> PartyData:
    """A probing party's data: its rows and, for each probe ID it does not hold, a row of zeros (no
    label: only a passive party probes), sorted by ID again. The IDs are ``keys`` where alignment is a
    phase, else ``ids`` (the dataset's, sent in Join)."""
    own = data.keys if data.keys is not None else data.ids
    new = np.array(sorted(set(np.array(probes, dtype=object).astype(own.dtype).tolist()) - set(own.tolist())))
    if not len(new):
        return data
    keys = np.concatenate([own, new.astype(own.dtype)])
    order = np.argsort(keys, kind="stable")
    x = data.x
    if x is not None:
        x = np.concatenate([x, np.zeros((len(new), *x.shape[1:]), x.dtype)])[order]
    if data.keys is None:
        return replace(data, ids=keys[order], x=x)
    return replace(data, ids=np.arange(len(keys), dtype=np.int64), keys=keys[order], x=x)


def aligned_view(data: PartyData, rows: np.ndarray) -> PartyData:
    """The party's aligned rows, numbered 0..n-1 in the run's order."""
    return replace(
        data,
        ids=np.arange(len(rows), dtype=np.int64),
        x=None if data.x is None else data.x[rows],
        y=None if data.y is None else data.y[rows],
        keys=None if data.keys is None else data.keys[rows],
    )


# -------------------------------------------------------------------------------- coordinator
@dataclass(frozen=True)
class Aligned:
    held: dict[str, int]  # party -> IDs it offered
    n_common: int
    wire_bytes: dict[str, int]  # party -> bytes of the alignment messages it sent (serialized)
    seconds: float = 0.0  # wall time of the phase at the coordinator
    cpu_s: float = 0.0  # the coordinator process's CPU seconds in it


def _offer_values(reply: messages_pb2.AlignReply, method: str, party: str) -> list[Any]:
    if method == "plain":
        return list(reply.keys)
    if len(reply.items) % POINT:
        raise RunFailed(f"alignment: {party}'s offer is not a whole number of {POINT}-byte elements")
    items = reply.items
    return [items[i : i + POINT] for i in range(0, len(items), POINT)]


def align(
    cfg: Config,
    stubs: dict[str, services_pb2_grpc.PartyStub],
    header: Callable[[], messages_pb2.Header],
    timeout: float,
) -> Aligned:
    """Drive the phase over ``stubs`` (every party); each party learns its own aligned rows."""
    names = list(stubs)
    method = cfg.alignment.method
    sent = dict.fromkeys([*names, "coordinator"], 0)

    def call(pairs: dict[str, messages_pb2.AlignRequest], what: str) -> dict[str, messages_pb2.AlignReply]:
        with ThreadPoolExecutor(len(pairs)) as pool:
            futures = {
                n: pool.submit(stubs[target].Align, req, timeout=timeout)
                for n, (target, req) in pairs.items()
            }
            out = {}
            for n, f in futures.items():
                try:
                    out[n] = f.result()
                except grpc.RpcError as exc:
                    raise RunFailed(f"alignment ({what}, {pairs[n][0]}): {describe_rpc_error(exc)}") from exc
                sent[pairs[n][0]] += out[n].ByteSize()
                sent["coordinator"] += pairs[n][1].ByteSize()
            return out

    def req(**kw: Any) -> messages_pb2.AlignRequest:
        return messages_pb2.AlignRequest(header=header(), **kw)

    offers = call({n: (n, req(op=messages_pb2.ALIGN_OFFER)) for n in names}, "offer")
    values = {n: _offer_values(r, method, n) for n, r in offers.items()}
    held = {n: len(v) for n, v in values.items()}
    if method == "psi":  # round r: party i's set goes to party i + r, until every secret is on it
        for r in range(1, len(names)):
            owner_of = {n: (names[(i + r) % len(names)]) for i, n in enumerate(names)}
            replies = call(
                {
                    n: (owner_of[n], req(op=messages_pb2.ALIGN_REBLIND, items=b"".join(values[n])))
                    for n in names
                },
                f"re-blinding, round {r}",
            )
            for n, reply in replies.items():
                got = _offer_values(reply, method, owner_of[n])
                if len(got) != held[n]:
                    raise RunFailed(f"alignment: {owner_of[n]} re-blinded {len(got)} of {held[n]} elements")
                values[n] = got
    common = set(values[names[0]]).intersection(*(values[n] for n in names[1:]))
    positions = {n: [i for i, v in enumerate(values[n]) if v in common] for n in names}
    call(
        {
            n: (n, req(op=messages_pb2.ALIGN_RESULT, positions=positions[n], n_common=len(common)))
            for n in names
        },
        "result",
    )
    return Aligned(held, len(common), sent)


def save(run_dir: Path, aligned: Aligned, method: str) -> None:
    record = {
        "method": method,
        "n_common": aligned.n_common,
        "held": aligned.held,
        "wire_bytes": aligned.wire_bytes,
        "seconds": aligned.seconds,
        "coordinator_cpu_s": aligned.cpu_s,
    }
    write_durable(run_dir / "alignment.json", json.dumps(record, indent=2).encode(), "the run's alignment")


def load(run_dir: Path, method: str) -> Aligned:
    """A resumed run's alignment, as the coordinator recorded it."""
    path = run_dir / "alignment.json"
    if not path.exists():
        raise RunFailed(f"cannot resume: no {path} (the run's alignment)")
    record = json.loads(path.read_text())
    if record["method"] != method:
        raise RunFailed(
            f"cannot resume: the run aligned with {record['method']!r}, alignment.method is {method!r}"
        )
    return Aligned(dict(record["held"]), int(record["n_common"]), dict(record["wire_bytes"]))
