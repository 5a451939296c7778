"""Records the passive parties' embeddings at the active party (the raw material of paper 000's
feature reconstruction: with an input-layer cut they are W_k x_k for every batch)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from vflnet.interceptors.events import WireEvent
from vflnet.registry import ATTACKS, Param
from vflnet.threat.attack import Attack, Tap
from vflnet.v1 import messages_pb2


@ATTACKS.register
class EmbeddingRecorder(Attack):
    name = "embedding-recorder"
    description = "records every passive party's embeddings (with sample IDs and step) at the active party"
    roles = frozenset({"active"})
    taps = (Tap("ExchangeEmbeddings", "request", "server"),)
    params = {
        "include_eval": Param(
            False, "also record evaluation steps", lambda v: isinstance(v, bool), "true/false"
        )
    }

    def __init__(self, context, **params) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.rows: dict[str, list[tuple[int, np.ndarray, np.ndarray]]] = defaultdict(list)
        self.encrypted: dict[str, int] = defaultdict(int)

    def observe(self, event: WireEvent) -> None:
        if event.phase != messages_pb2.TRAIN and not self.p["include_eval"]:
            return
        values = event.tensors().get("values")
        if values is None:  # split-he: ciphertexts the active party cannot read
            self.encrypted[event.sender] += 1
            return
        self.rows[event.sender].append((int(event.step), event.sample_ids, values))

    def output(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for sender, rows in sorted(self.rows.items()):
            out[f"{sender}/steps"] = np.concatenate([np.full(len(ids), step) for step, ids, _ in rows])
            out[f"{sender}/sample_ids"] = np.concatenate([ids for _, ids, _ in rows])
            out[f"{sender}/embeddings"] = np.concatenate([v for _, _, v in rows])
        for sender, count in sorted(self.encrypted.items()):
            out[f"{sender}/encrypted_batches"] = np.array(count)
        return out
