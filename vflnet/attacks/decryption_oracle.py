"""The residual trust assumption of `split-he`'s decryption service, as an attack (docs/protocols.md).

The coordinator decrypts one masked-gradient array per passive party per training step, bound to
the step, the party and the purpose, but it cannot tell what the ciphertexts in the array hold. A
malicious passive party appends the encrypted per-sample gradient [[g]] it received in the same step
(flattened, rescaled to its gradient's scale, masked and packed like its own rows) to its own
request, then takes the extra rows off the reply before its own code sees it: it reads g, and so
the label of every sample of its batches (g is negative only at the label, paper 004 Lemma 1),
while its update goes on unchanged. It needs nothing beyond its wire and the public key.

What the coordinator's checks leave it: one array per step, in training steps, for the step in
flight. A second request, a replay, another step or another purpose is refused
(`tests/test_security.py`), so the attack cannot ask for [[g]] of any other step, or for anything
outside its own request.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
from google.protobuf.message import Message

from vflnet.interceptors.events import WireEvent
from vflnet.registry import ATTACKS
from vflnet.threat.attack import LabelAttack, Tap
from vflnet.v1 import messages_pb2

STATISTICAL_BITS = 40  # the mask on the appended rows, as honest parties mask (vflnet.crypto.masking)


@ATTACKS.register
class DecryptionOracle(LabelAttack):
    name = "decryption-oracle"
    description = (
        "split-he, malicious passive party: appends the encrypted per-sample gradient it received to its "
        "own masked-gradient decryption request and reads every label of its batches from the reply"
    )
    roles = frozenset({"passive"})
    taps = (Tap("ExchangeEmbeddings", "request", "client"), Tap("ExchangeEmbeddings", "response", "client"))
    rewrites = (Tap("Decrypt", "request", "client"), Tap("Decrypt", "response", "client"))
    knowledge = ("public_key",)

    def __init__(self, context: Any, **params: Any) -> None:
        super().__init__(context, **params)
        self.ids: dict[int, np.ndarray] = {}  # step -> sample ids of its training batch
        self.received: dict[int, Any] = {}  # step -> the [[g]] CipherTensor it received
        self.pending: dict[int, tuple[int, np.ndarray, int, int, tuple[int, ...]]] = {}
        self.labels: dict[int, int] = {}
        self.skipped = 0  # steps whose [[g]] did not fit the request's packed slots

    def observe(self, event: WireEvent) -> None:
        msg = event.message
        if msg.header.phase != messages_pb2.TRAIN:
            return
        if event.direction == "request":
            self.ids[msg.header.step] = np.asarray(msg.sample_ids, dtype=np.int64)
        elif msg.WhichOneof("payload") == "cipher":
            self.received[msg.header.step] = msg.cipher

    def rewrite(self, event: WireEvent) -> Message | None:
        msg = event.message
        step = msg.header.step
        if event.direction == "request":
            if msg.purpose != "masked_gradient" or step not in self.received:
                return None
            return self._append(msg, step)
        if step not in self.pending:
            return None
        return self._take_off(msg, step)

    # ------------------------------------------------------------------ the two rewrites
    def _append(self, msg: messages_pb2.DecryptRequest, step: int) -> Message | None:
        from vflnet.crypto.cipher import concatenate
        from vflnet.crypto.errors import PaillierOverflowError
        from vflnet.crypto.wire import cipher_from_proto, cipher_to_proto

        key = self.context.knowledge["public_key"]
        own = cipher_from_proto(msg.cipher, key)  # [rows, L], packed
        g = cipher_from_proto(self.received.pop(step), key)  # [B, C], as the active party sent it
        if own.ndim != 2 or g.packed:
            return None
        width = own.shape[1]
        n = g.size
        rows = -(-n // width)
        try:
            flat = g.reshape(-1).with_frac_bits(own.frac_bits)
            zeros = key.encrypt(np.zeros(rows * width - n), own.frac_bits)
            extra = (
                concatenate([flat, zeros]).reshape(rows, width)
                if rows * width > n
                else flat.reshape(rows, width)
            )
            # a mask as wide as the honest request's own masked values: the rows look like its own and
            # fit its slots (what g adds stays within the honest mask's headroom)
            span = own.bound - extra.bound
            if span < extra.bound << STATISTICAL_BITS:
                raise ValueError("no room to mask g in this request's slots")
            r = np.empty((rows, width), dtype=object)
            r.reshape(-1)[:] = [secrets.randbelow(2 * span + 1) - span for _ in range(r.size)]
            appended = concatenate([own, extra.add_encoded(r).pack(slots=own.slots)])
        except (PaillierOverflowError, ValueError):
            self.skipped += 1  # g's values do not fit this request's slots: leave the request alone
            return None
        self.pending[step] = (own.shape[0], r, n, own.frac_bits, tuple(g.shape))
        out = messages_pb2.DecryptRequest()
        out.CopyFrom(msg)
        out.cipher.CopyFrom(cipher_to_proto(appended))
        return out

    def _take_off(self, msg: messages_pb2.DecryptReply, step: int) -> Message:
        from vflnet.crypto import encoding
        from vflnet.crypto.masking import ints_from_bytes, ints_to_bytes

        own_rows, r, n, frac_bits, g_shape = self.pending.pop(step)
        ints = ints_from_bytes(msg.integers, msg.integer_width, tuple(msg.shape))
        g = encoding.decode((ints[own_rows:] - r).reshape(-1)[:n], frac_bits).reshape(g_shape)
        ids = self.ids.pop(step)
        for sid, label in zip(ids.tolist(), np.argmin(g, axis=1).tolist(), strict=True):
            self.labels[int(sid)] = int(label)
        own = ints[:own_rows]
        data, width = ints_to_bytes(own)
        out = messages_pb2.DecryptReply()
        out.CopyFrom(msg)
        out.ClearField("shape")
        out.shape.extend(own.shape)
        out.integers, out.integer_width = data, width
        return out

    # ------------------------------------------------------------------ output and score
    def output(self) -> dict[str, np.ndarray]:
        ids = np.array(sorted(self.labels), dtype=np.int64)
        return {
            "sample_ids": ids,
            "labels": np.array([self.labels[i] for i in ids], dtype=np.int64),
            "skipped_steps": np.array(self.skipped),
        }
