"""Backpropagation over ciphertexts through a party's own bottom model.

Once the party's own activations are fixed, the gradient of its parameters is linear in the
incoming per-sample gradient g = dL/dH, so it can be computed on [[g]] with ciphertext x plaintext
products and ciphertext additions only (paper 004, eq. 4). Supported bottoms: ``Linear`` and
``Sequential`` stacks of ``Linear`` with ReLU / Tanh / Sigmoid between them (the MLPs of paper 004).

Plaintext multipliers (weights, activations, inputs, activation derivatives) are encoded with
`multiplier_frac_bits`: float32 precision relative to the largest |value| of each matrix, and exact
with fewer bits when the values allow it (integer pixel values, ReLU masks). The exponent length of
every ciphertext x plaintext product, hence its cost, follows the multiplier's bit length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from gmpy2 import mpz
from torch import nn

from vflnet.crypto import encoding
from vflnet.crypto.cipher import CipherArray, concatenate
from vflnet.crypto.randomness import object_array

_ACTIVATIONS = (nn.ReLU, nn.Tanh, nn.Sigmoid)
MULTIPLIER_BITS = 24  # significant bits kept per multiplier matrix: float32's significand


def multiplier_frac_bits(values: np.ndarray, significant_bits: int = MULTIPLIER_BITS) -> int:
    """Fractional bits for a plaintext multiplier matrix.

    At most `significant_bits` bits for the largest |value| (absolute error <= max|value| *
    2^-significant_bits per entry, float32's rounding of that entry), minus the trailing zero bits
    the encoded integers all share: values that are exact at fewer bits (integers, 0/1 masks,
    coarse floats) are encoded exactly with fewer bits.
    """
    values = np.asarray(values)
    if values.dtype.kind in "iub":
        return 0
    top = float(np.max(np.abs(values))) if values.size else 0.0
    if top == 0.0:
        return 0
    frac = max(0, significant_bits - math.frexp(top)[1])  # top * 2^frac < 2^significant_bits
    ints = np.rint(np.ldexp(values.astype(np.float64), frac)).astype(np.int64)
    nonzero = ints[ints != 0]
    if nonzero.size == 0:
        return 0
    shared_zeros = int(np.min(nonzero & -nonzero)).bit_length() - 1  # lowest set bit they all have free
    return frac - min(frac, shared_zeros)


def check_supported(module: nn.Module) -> None:
    layers = list(module) if isinstance(module, nn.Sequential) else [module]
    for layer in layers:
        if not isinstance(layer, (nn.Linear, *_ACTIVATIONS)):
            raise ValueError(
                f"split-he backpropagates over ciphertexts through Linear/ReLU/Tanh/Sigmoid only, not {type(layer).__name__}"
            )
    if not isinstance(layers[-1], nn.Linear):
        raise ValueError("split-he needs a bottom model that ends in a Linear layer")


@dataclass
class ForwardCache:
    """What the party keeps from its forward pass: each Linear's input and each activation's derivative."""

    inputs: list[np.ndarray]  # per Linear layer, [B, in]
    derivatives: list[
        np.ndarray | None
    ]  # per Linear layer: derivative of the activation after the previous Linear (ReLU: bool)


def forward_with_cache(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ForwardCache]:
    layers = list(module) if isinstance(module, nn.Sequential) else [module]
    inputs: list[np.ndarray] = []
    derivatives: list[np.ndarray | None] = []
    pending_derivative: np.ndarray | None = None
    h = x
    with torch.no_grad():
        for layer in layers:
            if isinstance(layer, nn.Linear):
                inputs.append(h.double().numpy())
                derivatives.append(pending_derivative)
                pending_derivative = None
                h = layer(h)
            else:
                z = h
                h = layer(z)
                if isinstance(layer, nn.ReLU):
                    pending_derivative = (z > 0).numpy()  # bool: a mask
                elif isinstance(layer, nn.Tanh):
                    pending_derivative = (1 - h.double() ** 2).numpy()
                else:
                    pending_derivative = (h.double() * (1 - h.double())).numpy()
    return h, ForwardCache(inputs, derivatives)


def _linears(module: nn.Module) -> list[tuple[str, nn.Linear]]:
    children = module.named_children() if isinstance(module, nn.Sequential) else [("", module)]
    return [(f"{name}." if name else "", layer) for name, layer in children if isinstance(layer, nn.Linear)]


def _backprop(
    module: nn.Module, cache: ForwardCache, grad: CipherArray, workers: int, last_weight: bool
) -> dict[str, CipherArray]:
    """[[dL/dtheta]] per parameter; the last Linear's weight only when `last_weight`."""
    linears = _linears(module)
    out: dict[str, CipherArray] = {}
    delta = grad  # [[dL/d(output of the current Linear)]], [B, out]
    for index in range(len(linears) - 1, -1, -1):
        prefix, layer = linears[index]
        a = cache.inputs[index]  # [B, in]
        if last_weight or index < len(linears) - 1:
            out[prefix + "weight"] = delta.T.matmul_plain(
                a, multiplier_frac_bits(a), workers
            )  # [out, B] @ [B, in]
        if layer.bias is not None:
            out[prefix + "bias"] = delta.sum(axis=0)
        if index > 0:
            w = layer.weight.detach().double().numpy()  # [out, in]
            derivative = cache.derivatives[index]
            if (
                derivative is not None and derivative.dtype == np.bool_
            ):  # ReLU: only the active units' products
                delta = delta.matmul_plain(w, multiplier_frac_bits(w), workers, where=derivative)  # [B, in]
            else:
                delta = delta.matmul_plain(w, multiplier_frac_bits(w), workers)
                if derivative is not None:
                    delta = delta.mul(derivative, multiplier_frac_bits(derivative), workers)
    return out


def encrypted_param_grads(
    module: nn.Module, cache: ForwardCache, grad: CipherArray, workers: int = 1
) -> dict[str, CipherArray]:
    """[[dL/dtheta]] for every parameter of ``module`` from [[dL/dH]] (shape [B, out])."""
    out = _backprop(module, cache, grad, workers, last_weight=True)
    return {name: out[name] for name, _ in module.named_parameters()}


@dataclass
class GradientLayout:
    """Where each parameter's gradient sits in the rows of `packed_param_grads`' array."""

    last_weight: str  # name of the last Linear's weight; its transpose fills the first rows
    last_shape: tuple[int, int]  # [out, in] of that weight
    shapes: dict[str, tuple[int, ...]]  # every parameter, in module order

    def split(self, values: np.ndarray) -> dict[str, np.ndarray]:
        """Per-parameter gradients from the decoded [rows, L] values of the packed array."""
        out_dim, in_dim = self.last_shape
        rest = values[in_dim:].reshape(-1)
        grads, offset = {}, 0
        for name, shape in self.shapes.items():
            if name == self.last_weight:
                grads[name] = values[:in_dim, :out_dim].T.copy()
                continue
            size = int(np.prod(shape, dtype=np.int64))
            grads[name] = rest[offset : offset + size].reshape(shape)
            offset += size
        return grads


def packed_param_grads(
    module: nn.Module, cache: ForwardCache, grad: CipherArray, headroom_bits: int = 0, workers: int = 1
) -> tuple[CipherArray, GradientLayout]:
    """Every parameter gradient in one packed array, ready to be masked and decrypted.

    The last Linear's weight gradient g^T a is the one term whose ciphertext side can be packed
    cheaply: packing [[g]] along the logits (one Horner chain per sample) turns its B x out x in
    ciphertext-plaintext products into B x in packed ones, and the result is already packed
    (as its transpose, in the first rows). The other gradients are computed unpacked, flattened
    into rows of the same length and packed. Slots leave `headroom_bits` free above the largest value
    (the decryption mask needs `STATISTICAL_BITS` + 2). Read the decrypted rows back with `GradientLayout.split`.
    """
    linears = _linears(module)
    prefix, last = linears[-1]
    a = cache.inputs[-1]  # [B, in] input of the last Linear
    frac_a = multiplier_frac_bits(a)
    rest_grads = _backprop(module, cache, grad, workers, last_weight=False)
    names = [name for name, _ in module.named_parameters()]
    rest_parts = [rest_grads[n].reshape(-1) for n in names if n != prefix + "weight"]
    empty = CipherArray(
        grad.public_key, object_array([], (0,)), (0,), grad.frac_bits, 0
    )  # a bias-free single Linear
    rest = concatenate([empty, *rest_parts])
    # the bound rmatmul_plain will give a^T [[g]]: |g| times the largest column sum of a's integers
    weight_bound = grad.bound * int(np.abs(encoding.encode(a, frac_a)).sum(axis=0).max(initial=0))
    weight_frac = grad.frac_bits + frac_a
    frac = max(rest.frac_bits, weight_frac)
    bound = max(rest.bound << (frac - rest.frac_bits), weight_bound << (frac - weight_frac))
    slots = encoding.max_slots(grad.public_key.bits, bound.bit_length() + 1 + headroom_bits)
    out_dim, in_dim = last.weight.shape
    row = encoding.packed_count(out_dim, slots) * slots  # row length L: whole packed ciphertexts
    weight_t = grad.pack(slots=slots, workers=workers).rmatmul_plain(a.T, frac_a, workers)  # [in, out]
    weight_t = CipherArray(
        grad.public_key, weight_t.data, (in_dim, row), weight_t.frac_bits, weight_t.bound, weight_t.slots
    )  # padding slots of [[g]] were Enc(0): they hold zeros
    pad = -rest.size % row
    zeros = CipherArray(
        grad.public_key, object_array([mpz(1)] * pad, (pad,)), (pad,), rest.frac_bits, 0
    )  # Enc(0)
    rest = concatenate([rest, zeros]).reshape(-1, row).pack(slots=slots, workers=workers)
    layout = GradientLayout(
        prefix + "weight", (out_dim, in_dim), {n: tuple(p.shape) for n, p in module.named_parameters()}
    )
    return concatenate([weight_t, rest]), layout
