"""Paillier split learning, paper 004 Algorithm 1, per role.

Passive k: encrypt its logits [[H_k]] under the coordinator's key (packed, `logit_slots` per
ciphertext) and send them; on the reply [[g]] = [[dL/dH]] (per sample, encrypted) backpropagate
over ciphertexts to [[grad theta_k]] (packed, `packed_param_grads`), mask it, have the coordinator
decrypt the masked values, unmask, update. It never sees a
per-sample gradient in plaintext, only its own batch-level parameter gradient.

Active: add the received ciphertexts homomorphically, have the coordinator decrypt the *masked*
aggregate (the paper leaves the softmax on encrypted logits undefined; docs/protocols.md explains
this choice), compute softmax + cross-entropy and g in plaintext, update its own bottom model,
and answer every passive party with [[g]].
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from vflnet.crypto import CipherArray, PublicKey, encoding, generate_keypair, save_public_key
from vflnet.crypto.masking import HEADROOM_BITS, ints_from_bytes, ints_to_bytes, mask, unmask
from vflnet.crypto.wire import cipher_from_proto, cipher_to_proto
from vflnet.protocols.he_backprop import (
    ForwardCache,
    check_supported,
    forward_with_cache,
    packed_param_grads,
)
from vflnet.protocols.he_settings import HE_PARAMS, he_settings, insecure_key_problem
from vflnet.protocols.split import (
    SPLIT_HOOKS,
    SplitActive,
    SplitPassive,
    StepResult,
    label_loss,
    outcome,
)
from vflnet.sdk import (
    PROTOCOLS,
    Config,
    CoordinatorSide,
    LabelDefense,
    LocalModel,
    Protocol,
    call,
    deadlines,
    handles,
    invalid,
    shown,
    wrong_state,
)
from vflnet.v1 import messages_pb2
from vflnet.wire.checks import check_sender, header
from vflnet.wire.ciphers import cipher_from_proto_checked

log = logging.getLogger("vflnet.split_he")
DECRYPT = "/vflnet.v1.Coordinator/Decrypt"

LOGIT_BITS = 16  # packed logits have room for |logit| < 2^16 ...
PARTY_BITS = 8  # ... summed over up to 2^8 passive parties, plus the active party's decryption mask


def logit_slots(public_key: PublicKey, frac_bits: int, width: int) -> int:
    """Logits per ciphertext when a passive party encrypts its [B, width] logits.

    Packing at encryption costs nothing and divides the encryptions, the active party's additions
    and its masked decryption by the slot count. Every party must pick the same layout (the active
    party adds the arrays slot by slot), so it depends on the key and the scale only; logits too
    large for it make the encryption or the active party's mask raise PaillierOverflowError
    instead of wrapping.
    """
    value_bits = frac_bits + LOGIT_BITS + 1 + PARTY_BITS + HEADROOM_BITS
    return min(width, encoding.max_slots(public_key.bits, value_bits))


# (purpose, masked ciphertexts) -> the exact masked integers the coordinator decrypted
Decryptor = Callable[[str, CipherArray], np.ndarray]


class PassiveHE:
    def __init__(
        self, local: LocalModel, public_key: PublicKey, frac_bits: int, decrypt: Decryptor, workers: int = 1
    ) -> None:
        self.local = local
        self.bottom = local.modules["bottom"]
        check_supported(self.bottom)
        self.public_key, self.frac_bits, self.decrypt, self.workers = public_key, frac_bits, decrypt, workers
        self._cache: ForwardCache | None = None
        self.last_masked_gradient: np.ndarray | None = None  # what this party sent (for tests/audits)

    def forward(self, x: np.ndarray, train: bool) -> CipherArray:
        self.local.train(train)
        logits, cache = forward_with_cache(self.bottom, torch.from_numpy(x))
        self._cache = cache if train else None
        values = logits.double().numpy()
        slots = logit_slots(self.public_key, self.frac_bits, values.shape[-1])
        return self.public_key.encrypt(values, self.frac_bits, slots=slots, workers=self.workers)

    def backward(self, grad: CipherArray) -> np.ndarray:
        """Apply one update from [[dL/dH]]; returns the plaintext batch-level gradient it learned."""
        if self._cache is None:
            raise RuntimeError("backward without a training forward pass")
        cache, self._cache = self._cache, None
        packed, layout = packed_param_grads(self.bottom, cache, grad, HEADROOM_BITS, self.workers)
        masked, r = mask(packed, workers=self.workers)
        grads = layout.split(unmask(self.decrypt("masked_gradient", masked), r, masked.frac_bits))
        for name, p in self.bottom.named_parameters():
            p.grad = torch.from_numpy(grads[name]).to(p.dtype)
        self.local.apply_update()
        return np.concatenate([g.reshape(-1) for g in grads.values()])


class ActiveHE:
    def __init__(
        self,
        local: LocalModel,
        public_key: PublicKey,
        frac_bits: int,
        decrypt: Decryptor,
        workers: int = 1,
        defense: LabelDefense | None = None,
    ) -> None:
        self.local = local
        self.defense = defense
        self.bottom = local.modules.get("bottom")
        self.top = local.modules["top"]
        self.public_key, self.frac_bits, self.decrypt, self.workers = public_key, frac_bits, decrypt, workers

    def step(
        self, x_own: np.ndarray | None, received: list[CipherArray], y: np.ndarray | None, train: bool
    ) -> tuple[CipherArray | None, StepResult]:
        """One step up to the encrypted gradient it sends; ``y`` is None in a prediction step (no loss,
        no gradient). A training step's own update is ``update``, once that gradient is out."""
        train = train and y is not None
        total = received[0]
        for c in received[1:]:
            total = total + c
        masked, r = mask(total, workers=self.workers)
        passive_sum = unmask(self.decrypt("aggregate_logits", masked), r, masked.frac_bits).astype(np.float32)
        self.local.train(train)
        with torch.set_grad_enabled(train):
            h = torch.from_numpy(passive_sum).requires_grad_(train)
            aggregate = h + self.bottom(torch.from_numpy(x_own)) if self.bottom is not None else h
            logits = self.top(aggregate)
            loss = None if y is None else label_loss(logits, torch.from_numpy(y), self.defense)
            encrypted_grad = None
            if train:
                assert loss is not None and y is not None
                loss.backward()
                assert h.grad is not None
                target = torch.from_numpy(y)
                g = (
                    h.grad if self.defense is None else self.defense.transform(h.grad, target)
                )  # defend, then encrypt
                encrypted_grad = self.public_key.encrypt(
                    g.double().numpy(), self.frac_bits, workers=self.workers
                )
        return encrypted_grad, outcome(logits, loss, y, self.defense, [])

    def update(self) -> None:
        """The optimizer step of a training step's gradients (after ``step``, as in split)."""
        self.local.apply_update()


# --------------------------------------------------------------------------------- sides
class DecryptionService(CoordinatorSide):
    """The coordinator holds the Paillier private key and decrypts what parties send.

    Parties mask everything before asking (vflnet.crypto.masking), so what it decrypts is
    statistically independent of the values. It checks who may ask for what, and counts it all.

    It is no decryption oracle: a request is bound to the step in flight (its number and phase), to
    the requester's role and purpose, one per (step, party, purpose), and to the shape the protocol
    expects: the aggregate logits have one row per sample of the step and the width of the first
    request; a party's masked gradient exists only in training steps. Its size is not checked: the
    packed layout depends on the step's values, and the coordinator never sees the models. What
    remains trusted, a party putting other ciphertexts into its one gradient array per step, is in
    docs/protocols.md and docs/security.md (the `decryption-oracle` attack shows it)."""

    PURPOSES = {"aggregate_logits": {"active"}, "masked_gradient": {"passive"}}

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        he = he_settings(self.cfg)
        start = time.perf_counter()
        self.public_key, self._private_key = generate_keypair(
            he.key_bits, allow_insecure=he.allow_insecure_keys
        )
        log.info(
            "generated a %d-bit Paillier key pair (key id %s) in %.1f s",
            he.key_bits,
            self.public_key.key_id,
            time.perf_counter() - start,
        )
        if host.run_dir is not None:
            save_public_key(host.run_dir / "public_key.json", self.public_key)
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.values: dict[str, int] = {}
        self.step = messages_pb2.Header()  # the step in flight (its header and batch size)
        self.batch_size = 0
        self.served: set[tuple[str, str]] = set()  # (party, purpose) decrypted in this step
        self.shapes: dict[tuple[str, str], tuple[int, ...]] = {}  # logit width, fixed by the first request

    def command(self, party: str, cmd: messages_pb2.StepCommand) -> messages_pb2.StepCommand:
        with self.lock:
            if cmd.header.step != self.step.step:
                self.step, self.batch_size, self.served = cmd.header, len(cmd.sample_ids), set()
        return cmd

    def join_reply(self, reply: messages_pb2.JoinReply) -> None:
        reply.protocol.values["public_key"] = json.dumps(self.public_key.to_json()).encode()

    @handles(DECRYPT, callers={"active", "passive"})
    def decrypt(self, req: messages_pb2.DecryptRequest, context: Any) -> messages_pb2.DecryptReply:
        allowed = self.PURPOSES.get(req.purpose)
        if allowed is None:
            raise invalid(f"unknown decryption purpose {shown(req.purpose)}; known: {sorted(self.PURPOSES)}")
        check_sender(self.cfg, req.header.sender, allowed, context)  # the purpose's roles, within the callers
        try:
            masked = cipher_from_proto(req.cipher, self.public_key)
        except (ValueError, OverflowError) as exc:
            raise invalid(f"cannot decrypt: {exc}") from exc
        self._bind(req, masked.shape)
        try:
            ints = self._private_key.decrypt_encoded(masked, workers=he_settings(self.cfg).workers)
        except (ValueError, OverflowError) as exc:
            raise invalid(f"cannot decrypt: {exc}") from exc
        data, width = ints_to_bytes(ints)
        key = f"{req.header.sender}/{req.purpose}"
        with self.lock:
            self.requests[key] = self.requests.get(key, 0) + 1
            self.values[key] = self.values.get(key, 0) + ints.size
        reply_header = header(
            self.cfg,
            self.cfg.coordinator.name,
            req.header.step,
            req.header.epoch,
            req.header.batch_id,
            req.header.phase,
            0,
        )
        return messages_pb2.DecryptReply(
            header=reply_header, shape=list(ints.shape), integer_width=width, integers=data
        )

    def _bind(self, req: messages_pb2.DecryptRequest, shape: tuple[int, ...]) -> None:
        """Refuse (FAILED_PRECONDITION / INVALID_ARGUMENT) a request the step in flight does not call for;
        on success the (party, purpose) slot of this step is spent."""
        h, key = req.header, (req.header.sender, req.purpose)
        with self.lock:
            if self.step.step == 0 or h.step != self.step.step or h.phase != self.step.phase:
                raise wrong_state(
                    f"decryption for step {h.step} (phase {h.phase}); step {self.step.step} "
                    f"(phase {self.step.phase}) is in flight",
                )
            if req.purpose == "masked_gradient" and h.phase != messages_pb2.TRAIN:
                raise wrong_state("a masked gradient exists only in training")
            if key in self.served:
                raise wrong_state(
                    f"{h.sender} already had its {req.purpose} of step {h.step} decrypted",
                )
            if req.purpose == "aggregate_logits" and (len(shape) != 2 or shape[0] != self.batch_size):
                raise invalid(
                    f"aggregate logits of shape {shape}; step {h.step} has {self.batch_size} samples"
                )
            if req.purpose == "aggregate_logits":
                expected = self.shapes.setdefault(key, shape[1:])
                if shape[1:] != expected:
                    raise invalid(
                        f"aggregate logits of shape {shape}; earlier requests fixed {expected} per row"
                    )
            self.served.add(key)

    def finish(self) -> dict[str, Any]:
        return {"decryptions": {"requests": self.requests, "values": self.values}}

    def state_dict(self) -> dict[str, Any]:
        """The counts and the logit width fixed so far; the key pair is not kept: a resumed run's
        coordinator makes a new one, and the parties get its public key on admission."""
        return {"requests": self.requests, "values": self.values, "shapes": self.shapes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.requests, self.values, self.shapes = state["requests"], state["values"], state["shapes"]


class Decryption:
    """A party's client of the coordinator's masked decryption."""

    def __init__(self, host: Any, reply: messages_pb2.JoinReply) -> None:
        self.host = host
        self.public_key = PublicKey.from_json(json.loads(reply.protocol.values["public_key"]))
        host.interception.knowledge["public_key"] = self.public_key  # public: any attack may use it

    def __call__(self, purpose: str, masked: CipherArray) -> np.ndarray:
        """The coordinator's decryption of masked ciphertexts (exact masked integers)."""
        host, cfg = self.host, self.host.cfg
        req = messages_pb2.DecryptRequest(
            header=host.header(host.current),
            purpose=purpose,
            cipher=cipher_to_proto(masked, workers=he_settings(cfg).workers),
        )
        reply = call(host, host.coordinator_channel, cfg.coordinator.name, DECRYPT, req)
        return ints_from_bytes(reply.integers, reply.integer_width, tuple(reply.shape))


class SplitHEPassive(SplitPassive):
    """Encrypted logits up; encrypted per-sample gradients down, backpropagated over ciphertexts."""

    def step_work_s(self) -> float:
        """Its model's work plus the step's Paillier work: logits encrypted, the gradient backpropagated
        over ciphertexts (a product and an addition per sample and parameter), the masked gradient
        decrypted (packed: a ciphertext holds at least bits / 64 of them)."""
        bits, batch = he_settings(self.cfg).key_bits, self.cfg.train.batch_size
        params = sum(p.numel() for p in self.host.local.modules["bottom"].parameters())
        out = self.host.me.bottom.out if self.host.me.bottom is not None else 0
        return (
            super().step_work_s()
            + deadlines.paillier_s("encrypt", bits, deadlines.largest_batch(self.cfg) * out)
            + deadlines.paillier_s("product", bits, batch * params)
            + deadlines.paillier_s("add", bits, batch * params)
            + deadlines.paillier_s("decrypt", bits, params * 64 / bits)
        )

    def make_compute(self) -> PassiveHE:
        he = he_settings(self.cfg)
        self.decryption = Decryption(self.host, self.host.join_reply)
        return PassiveHE(
            self.host.local, self.decryption.public_key, he.frac_bits, self.decryption, he.workers
        )

    def encode(self, msg: messages_pb2.Embeddings, emb: Any) -> None:
        msg.cipher.CopyFrom(cipher_to_proto(emb, workers=he_settings(self.cfg).workers))

    def decode_gradient(self, reply: messages_pb2.EmbeddingGradients, shape: tuple[int, ...]) -> Any:
        if reply.WhichOneof("payload") != "cipher":
            raise invalid("split-he expects encrypted gradients from the active party")
        return cipher_from_proto_checked(
            reply.cipher, self.decryption.public_key, shape, "gradients from the active party"
        )


class SplitHEActive(SplitActive):
    """Add the encrypted logits, have the masked sum decrypted, answer every passive party with [[g]]."""

    def step_work_s(self) -> float:
        """Its model's work plus [[g]] encrypted and the masked sum of logits decrypted (packed: a
        ciphertext holds at least bits / 64 logits)."""
        bits, batch = he_settings(self.cfg).key_bits, deadlines.largest_batch(self.cfg)
        width = max((p.bottom.out for p in self.cfg.passives if p.bottom is not None), default=0)
        return (
            super().step_work_s()
            + deadlines.paillier_s("encrypt", bits, self.cfg.train.batch_size * width)
            + deadlines.paillier_s("decrypt", bits, batch * width * 64 / bits)
        )

    def make_compute(self) -> ActiveHE:
        he = he_settings(self.cfg)
        self.decryption = Decryption(self.host, self.host.join_reply)
        return ActiveHE(
            self.host.local,
            self.decryption.public_key,
            he.frac_bits,
            self.decryption,
            he.workers,
            self.defense,
        )

    def precheck(self, msg: messages_pb2.Embeddings, expect: tuple[int, int], what: str) -> None:
        """Before admission there is no public key yet: the payload's kind and declared shape."""
        if msg.WhichOneof("payload") != "cipher":
            raise invalid(f"split-he expects encrypted embeddings, got {msg.WhichOneof('payload')}")
        if tuple(msg.cipher.shape) != expect:
            raise invalid(f"{what}: ciphertext shape {tuple(msg.cipher.shape)} where {expect} was expected")

    def decode(self, msg: messages_pb2.Embeddings, expect: tuple[int, int], what: str) -> Any:
        self.precheck(msg, expect, what)
        return cipher_from_proto_checked(msg.cipher, self.decryption.public_key, expect, what)

    def run(
        self, x_own: np.ndarray | None, received: list[Any], y: np.ndarray | None, train: bool
    ) -> StepResult:
        grad, result = self.compute.step(x_own, received, y, train)
        if grad is not None:  # every passive party receives the same [[dL/dH]]
            result.grads = [cipher_to_proto(grad, workers=he_settings(self.cfg).workers)] * len(received)
        return result

    def fill_reply(self, reply: messages_pb2.EmbeddingGradients, index: int, result: StepResult) -> None:
        reply.cipher.CopyFrom(result.grads[index])


@PROTOCOLS.register
class SplitHE(Protocol):
    name = "split-he"
    settings = frozenset({"aggregation"})
    params = HE_PARAMS
    provides = frozenset({"public_key"})  # SplitHEPassive/Active.joined: the coordinator's key
    description = "paper 004 Algorithm 1: Paillier-encrypted logits and per-sample gradients, masked decryption at the coordinator"
    coordinator = DecryptionService
    active = SplitHEActive
    passive = SplitHEPassive
    defense_hooks = SPLIT_HOOKS

    @classmethod
    def check_config(cls, cfg: Config) -> list[tuple[str, str]]:
        problems = []
        if cfg.protocol.aggregation != "sum" or cfg.model.top.kind != "none":
            problems.append(
                ("protocol.kind", "split-he follows paper 004: aggregation 'sum' with model.top.kind 'none'")
            )
        return problems + insecure_key_problem(cfg)
