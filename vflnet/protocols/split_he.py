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

from collections.abc import Callable

import numpy as np
import torch

from vflnet.crypto import CipherArray, PublicKey, encoding
from vflnet.crypto.masking import HEADROOM_BITS, mask, unmask
from vflnet.defenses.label_defenses import LabelDefense
from vflnet.protocols.he_backprop import (
    ForwardCache,
    check_supported,
    forward_with_cache,
    packed_param_grads,
)
from vflnet.protocols.split import LocalModel, StepResult, label_loss, predict

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
    def __init__(self, local: LocalModel, public_key: PublicKey, frac_bits: int, decrypt: Decryptor, workers: int = 1) -> None:
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
    def __init__(self, local: LocalModel, public_key: PublicKey, frac_bits: int, decrypt: Decryptor, workers: int = 1,
                 defense: LabelDefense | None = None) -> None:
        self.local = local
        self.defense = defense
        self.bottom = local.modules.get("bottom")
        self.top = local.modules["top"]
        self.public_key, self.frac_bits, self.decrypt, self.workers = public_key, frac_bits, decrypt, workers

    def step(self, x_own: np.ndarray | None, received: list[CipherArray], y: np.ndarray, train: bool) -> tuple[CipherArray | None, StepResult]:
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
            target = torch.from_numpy(y)
            loss = label_loss(logits, target, self.defense)
            encrypted_grad = None
            if train:
                loss.backward()
                assert h.grad is not None
                g = h.grad if self.defense is None else self.defense.transform(h.grad, target)  # defend, then encrypt
                encrypted_grad = self.public_key.encrypt(g.double().numpy(), self.frac_bits, workers=self.workers)
                self.local.apply_update()
        correct = int((predict(logits.detach(), self.defense) == target).sum())
        return encrypted_grad, StepResult([], float(loss.detach()) * len(y), correct, len(y), logits.detach().numpy())
