"""Exceptions of the Paillier engine: loud, specific failures instead of silent wrap-around."""


class PaillierOverflowError(OverflowError):
    """A value does not fit its plaintext slot or the plaintext space.

    Raised *before* a homomorphic operation whose result could wrap modulo n (the engine tracks an
    upper bound on every array), and on decryption when a value lies outside the tracked bound (a
    sign of overflow or of a tampered ciphertext). The engine never returns a wrapped value.
    """


class KeyMismatchError(ValueError):
    """Two operands, or a ciphertext and a key, belong to different Paillier key pairs."""
