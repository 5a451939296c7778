"""Fast vectorised Paillier engine on gmpy2, key-compatible with `phe` (python-paillier).

See `cipher` for the array type, `encoding` for fixed point and packing, `randomness` for the DJN
encryption randomness (and its security note), `wire` for the protobuf codec.
"""

from vflnet.crypto.cipher import (
    DEFAULT_FRAC_BITS,
    DEFAULT_KEY_BITS,
    DEFAULT_MUL_FRAC_BITS,
    CipherArray,
    PrivateKey,
    PublicKey,
    concatenate,
    generate_keypair,
    key_id_of,
    load_keypair,
    load_public_key,
    save_keypair,
    save_public_key,
)
from vflnet.crypto.errors import KeyMismatchError, PaillierOverflowError
from vflnet.crypto.parallel import shutdown_pools

__all__ = [
    "DEFAULT_FRAC_BITS",
    "DEFAULT_KEY_BITS",
    "DEFAULT_MUL_FRAC_BITS",
    "CipherArray",
    "KeyMismatchError",
    "PaillierOverflowError",
    "PrivateKey",
    "PublicKey",
    "concatenate",
    "generate_keypair",
    "key_id_of",
    "load_keypair",
    "load_public_key",
    "save_keypair",
    "save_public_key",
    "shutdown_pools",
]
