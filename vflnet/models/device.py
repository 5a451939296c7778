"""Where torch computes: a party's models (``train.device``, ``parties[].device``) and the CAFE attack
(``device`` of the ``cafe`` tap). Everything that crosses the wire is numpy on the host, whatever the
device: a model's inputs go to its device at its first layer, its outputs come back before they are sent."""

from __future__ import annotations

import re

import torch

DEVICE_NAMES = "cpu, cuda or cuda:N"


def resolve_device(name: str | torch.device) -> torch.device:
    """``name`` as a torch device, failing clearly where CUDA is asked for but torch cannot use it."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", str(name)):
        raise ValueError(f"device must be {DEVICE_NAMES}, got {str(name)!r}")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        built = (
            "built without CUDA"
            if torch.version.cuda is None
            else f"CUDA {torch.version.cuda}, no GPU visible"
        )
        raise RuntimeError(
            f"device {str(name)!r} was asked for but torch {torch.__version__} ({built}) cannot use CUDA "
            "on this machine; use the CPU (device 'cpu') here"
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeError(
            f"device {str(name)!r} was asked for but torch sees {torch.cuda.device_count()} GPU(s) here"
        )
    return device
