"""A malicious passive party rescales the gradients it receives before using them (the gamma
step of paper 004's label replacement backdoor, Algorithm 3). Under `split-he` the gradients are
ciphertexts and the rescaling is ciphertext x plaintext: no decryption needed."""

from __future__ import annotations

import numpy as np
from google.protobuf.message import Message

from vflnet.interceptors.events import WireEvent
from vflnet.registry import ATTACKS, Param
from vflnet.threat.attack import Attack, Tap
from vflnet.v1 import messages_pb2
from vflnet.wire import tensors


@ATTACKS.register
class GradientScaling(Attack):
    name = "gradient-scaling"
    description = (
        "rewrites the incoming gradients of a passive party: g -> gamma * g (plaintext or encrypted)"
    )
    roles = frozenset({"passive"})
    taps = ()
    rewrites = (Tap("ExchangeEmbeddings", "response", "client"),)
    knowledge = ("public_key",)
    params = {"gamma": Param(10.0, "scale factor", lambda v: isinstance(v, int | float), "a number")}

    def __init__(self, context, **params) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.rewritten = 0

    def observe(self, event: WireEvent) -> None:
        """Rewrites only."""

    def rewrite(self, event: WireEvent) -> Message | None:
        msg = event.message
        if msg.header.phase != messages_pb2.TRAIN or msg.WhichOneof("payload") is None:
            return None
        out = messages_pb2.EmbeddingGradients()
        out.CopyFrom(msg)
        if msg.WhichOneof("payload") == "values":
            out.values.CopyFrom(
                tensors.to_proto(tensors.from_proto(msg.values) * np.float32(self.p["gamma"]))
            )
        else:
            from vflnet.crypto.wire import cipher_from_proto, cipher_to_proto

            key = self.context.knowledge["public_key"]
            scaled = cipher_from_proto(msg.cipher, key).mul(float(self.p["gamma"]))
            out.cipher.CopyFrom(cipher_to_proto(scaled))
        self.rewritten += 1
        return out

    def output(self) -> dict[str, np.ndarray]:
        return {"rewritten_messages": np.array(self.rewritten)}
