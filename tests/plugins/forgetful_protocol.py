"""A test plug-in protocol that declares the ``labels`` defense hook and never applies it: split
learning whose active party builds no label defense. A run with a label defense must fail, naming the
defense and the hook (the host counts what each defense did, vflnet/threat/effects.py)."""

from __future__ import annotations

from vflnet.protocols.split import Split, SplitActive
from vflnet.sdk.contract import PROTOCOLS


class ForgetfulActive(SplitActive):
    def _defense(self) -> None:
        return None  # the declared hook point is never reached


@PROTOCOLS.register
class ForgetfulSplit(Split):
    name = "forgetful-split"
    description = "test only: split learning that declares the labels hook and never applies it"
    active = ForgetfulActive
