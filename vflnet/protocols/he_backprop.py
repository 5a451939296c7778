"""Backpropagation over ciphertexts through a party's own bottom model.

Once the party's own activations are fixed, the gradient of its parameters is linear in the
incoming per-sample gradient g = dL/dH, so it can be computed on [[g]] with ciphertext x plaintext
products and ciphertext additions only (paper 004, eq. 4). Supported bottoms: ``Linear`` and
``Sequential`` stacks of ``Linear`` with ReLU / Tanh / Sigmoid between them (the MLPs of paper 004).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from vflnet.crypto.cipher import CipherArray

_ACTIVATIONS = (nn.ReLU, nn.Tanh, nn.Sigmoid)


def check_supported(module: nn.Module) -> None:
    layers = list(module) if isinstance(module, nn.Sequential) else [module]
    for layer in layers:
        if not isinstance(layer, (nn.Linear, *_ACTIVATIONS)):
            raise ValueError(f"split-he backpropagates over ciphertexts through Linear/ReLU/Tanh/Sigmoid only, not {type(layer).__name__}")
    if not isinstance(layers[-1], nn.Linear):
        raise ValueError("split-he needs a bottom model that ends in a Linear layer")


@dataclass
class ForwardCache:
    """What the party keeps from its forward pass: each Linear's input and each activation's derivative."""

    inputs: list[np.ndarray]  # per Linear layer, [B, in]
    derivatives: list[np.ndarray | None]  # per Linear layer: derivative of the activation after the previous Linear


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
                    pending_derivative = (z > 0).to(torch.int64).numpy()
                elif isinstance(layer, nn.Tanh):
                    pending_derivative = (1 - h.double() ** 2).numpy()
                else:
                    pending_derivative = (h.double() * (1 - h.double())).numpy()
    return h, ForwardCache(inputs, derivatives)


def encrypted_param_grads(module: nn.Module, cache: ForwardCache, grad: CipherArray, workers: int = 1) -> dict[str, CipherArray]:
    """[[dL/dtheta]] for every parameter of ``module`` from [[dL/dH]] (shape [B, out])."""
    linears = [(name, layer) for name, layer in (module.named_children() if isinstance(module, nn.Sequential) else [("", module)])
               if isinstance(layer, nn.Linear)]
    out: dict[str, CipherArray] = {}
    delta = grad  # [[dL/d(output of the current Linear)]], [B, out]
    for index in range(len(linears) - 1, -1, -1):
        name, layer = linears[index]
        prefix = f"{name}." if name else ""
        a = cache.inputs[index]  # [B, in]
        out[prefix + "weight"] = delta.T.matmul_plain(a, workers=workers)  # [out, B] @ [B, in]
        if layer.bias is not None:
            out[prefix + "bias"] = delta.sum(axis=0)
        if index > 0:
            w = layer.weight.detach().double().numpy()  # [out, in]
            delta = delta.matmul_plain(w, workers=workers)  # [B, in]
            derivative = cache.derivatives[index]
            if derivative is not None:
                delta = delta.mul(derivative, workers=workers)
    return {name: out[name] for name, _ in module.named_parameters()}
