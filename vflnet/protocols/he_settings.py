"""The Paillier settings of the protocols that encrypt (split-he, secureboost), declared in their
contracts as ``protocol.params`` like any plug-in protocol's settings.

``HE_PARAMS`` is the shared part of their ``Protocol.params``; :func:`he_settings` reads the checked
values of a config as one typed object; :func:`insecure_key_problem` is the refusal of small keys
that both protocols' ``check_config`` return.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vflnet.sdk import Config, Param


def _integer(lo: int) -> Any:
    def ok(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo

    return ok


HE_PARAMS: dict[str, Param] = {
    "key_bits": Param(
        2048,
        "Paillier modulus size; under 1024 needs `allow_insecure_keys: true` and prints a warning",
        _integer(256),
        "an integer >= 256",
    ),
    "frac_bits": Param(
        20, "fixed-point fractional bits of encrypted logits and gradients", _integer(1), "an integer >= 1"
    ),
    "allow_insecure_keys": Param(
        False, "permit keys under 1024 bits (tests only)", lambda v: isinstance(v, bool), "true or false"
    ),
    "workers": Param(1, "processes per party for Paillier work", _integer(1), "an integer >= 1"),
}


@dataclass(frozen=True)
class HESettings:
    key_bits: int
    frac_bits: int
    allow_insecure_keys: bool
    workers: int


def he_settings(cfg: Config) -> HESettings:
    """The run's Paillier settings (``protocol.params``, defaults filled in by the config check; one the
    run does not read, secureboost's frac_bits or its key in the plain mode, is left at its default)."""
    return HESettings(**{name: cfg.protocol.params.get(name, p.default) for name, p in HE_PARAMS.items()})


def insecure_key_problem(cfg: Config) -> list[tuple[str, str]]:
    """The refusal of keys under 1024 bits unless the config allows them (tests only)."""
    he = he_settings(cfg)
    if he.key_bits < 1024 and not he.allow_insecure_keys:
        return [
            (
                "protocol.params.key_bits",
                "keys under 1024 bits are insecure; set protocol.params.allow_insecure_keys: true (tests only)",
            )
        ]
    return []
