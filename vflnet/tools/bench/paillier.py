"""`vflnet bench paillier`: throughput of the vflnet Paillier engine against phe (and HEU if present).

Every figure is values (or multiply-adds for mat-vec) per second on this machine, from repeated
calls over at least 0.25 s per cell. phe runs with gmpy2. The engine encodes plaintext multipliers with 32 fractional bits;
phe encodes floats with their full 53-bit mantissa.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import phe

from vflnet.crypto import generate_keypair, shutdown_pools
from vflnet.tools.bench.common import Row, parse_args, write_json

OPS = ("encrypt", "decrypt", "add", "mul scalar", "mat-vec")


def _rate(fn: Callable[[], Any], count: int, min_seconds: float = 0.25) -> float:
    """count * calls / seconds, calling fn until at least `min_seconds` have passed."""
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return count * calls / elapsed


def _engine(bits: int, n: int, dim: int, workers: int) -> tuple[dict[str, float], dict[str, float], float]:
    """(unpacked rates, packed rates, key+table setup seconds)."""
    start = time.perf_counter()
    pk, sk = generate_keypair(bits)
    pk.randomness  # noqa: B018 - build the fixed-base table outside the timed region
    setup = time.perf_counter() - start
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    w, v = rng.uniform(-1, 1, (dim, dim)), rng.uniform(-1, 1, dim)
    if workers > 1:  # start the pool and build each worker's randomness table outside the timing
        sk.decrypt(pk.encrypt(x, workers=workers).mul(0.5, workers=workers), workers=workers)
    rates: dict[str, float] = {}
    packed: dict[str, float] = {}
    for pack, out in ((False, rates), (True, packed)):
        out["encrypt"] = _rate(lambda p=pack: pk.encrypt(x, pack=p, workers=workers), n)
        cx, cy = pk.encrypt(x, pack=pack), pk.encrypt(y, pack=pack)
        out["decrypt"] = _rate(lambda c=cx: sk.decrypt(c, workers=workers), n)
        out["add"] = _rate(lambda a=cx, b=cy: a + b, n)
        out["mul scalar"] = _rate(lambda a=cx: a.mul(0.37, workers=workers), n)
    cv = pk.encrypt(v)
    rates["mat-vec"] = _rate(lambda: cv.rmatmul_plain(w, workers=workers), dim * dim)
    got = sk.decrypt(cv.rmatmul_plain(w))
    if not np.allclose(got, w @ v, atol=1e-6):
        raise RuntimeError("engine mat-vec result is wrong")
    return rates, packed, setup


def _phe(bits: int, n: int, dim: int) -> dict[str, float]:
    pk, sk = phe.generate_paillier_keypair(n_length=bits)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, n).tolist(), rng.uniform(-1, 1, n).tolist()
    w, v = rng.uniform(-1, 1, (dim, dim)).tolist(), rng.uniform(-1, 1, dim).tolist()
    rates = {"encrypt": _rate(lambda: [pk.encrypt(a) for a in x], n)}
    cx, cy = [pk.encrypt(a) for a in x], [pk.encrypt(a) for a in y]
    rates["decrypt"] = _rate(lambda: [sk.decrypt(c) for c in cx], n)
    rates["add"] = _rate(lambda: [a + b for a, b in zip(cx, cy, strict=True)], n)
    rates["mul scalar"] = _rate(lambda: [a * 0.37 for a in cx], n)
    cv = [pk.encrypt(a) for a in v]

    def matvec() -> list[Any]:
        return [sum((c * wij for c, wij in zip(cv, row, strict=True)), pk.encrypt(0, r_value=1)) for row in w]

    rates["mat-vec"] = _rate(matvec, dim * dim)
    return rates


def _heu(bits: int, n: int, dim: int) -> dict[str, float]:
    from heu import numpy as hnp
    from heu import phe as hphe

    kit = hnp.setup(hphe.SchemaType.ZPaillier, bits)
    enc = kit.float_encoder()
    rng = np.random.default_rng(0)
    x, y = kit.array(rng.uniform(-1, 1, n), enc), kit.array(rng.uniform(-1, 1, n), enc)
    w, v = kit.array(rng.uniform(-1, 1, (dim, dim)), enc), kit.array(rng.uniform(-1, 1, dim), enc)
    encryptor, decryptor, evaluator = kit.encryptor(), kit.decryptor(), kit.evaluator()
    rates = {"encrypt": _rate(lambda: encryptor.encrypt(x), n)}
    cx, cy, cv = encryptor.encrypt(x), encryptor.encrypt(y), encryptor.encrypt(v)
    scalar = kit.array(np.full(n, 0.37), enc)
    rates["decrypt"] = _rate(lambda: decryptor.decrypt(cx), n)
    rates["add"] = _rate(lambda: evaluator.add(cx, cy), n)
    rates["mul scalar"] = _rate(lambda: evaluator.mul(cx, scalar), n)
    rates["mat-vec"] = _rate(lambda: evaluator.matmul(w, cv), dim * dim)
    return rates


def _heu_status() -> str | None:
    """None when HEU can be used, else the reason it cannot."""
    try:
        from heu import numpy as hnp  # noqa: F401
        from heu import phe as hphe  # noqa: F401
    except ImportError as err:
        return f"not installable here ({err}; try `pip install sf-heu`)"
    return None


def _fmt(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:,.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:,.1f}x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vflnet bench paillier", description=__doc__)
    parser.add_argument("--bits", type=int, nargs="+", default=[1024, 2048], help="key sizes")
    parser.add_argument("--n", type=int, default=64, help="values per encrypt/decrypt/add/mul measurement")
    parser.add_argument("--dim", type=int, default=24, help="mat-vec size: (dim x dim) plaintext @ [[dim]]")
    parser.add_argument("--workers", type=int, default=1, help="engine worker processes")
    parser.add_argument("--no-heu", action="store_true", help="skip SecretFlow HEU even if installed")
    args = parse_args(parser, argv, smoke={"bits": [1024], "n": 8, "dim": 4, "no_heu": True})

    heu_reason = "skipped (--no-heu)" if args.no_heu else _heu_status()
    if heu_reason is not None:
        print(f"HEU: {heu_reason}")
    header = (
        f"{'bits':>5} {'op':<11} {'engine':>10} {'packed':>10} {'phe':>9} {'heu':>9} "
        f"{'eng/phe':>8} {'pack/phe':>9} {'heu/phe':>8}"
    )
    print(f"values/s (mat-vec: multiply-adds/s), workers={args.workers}")
    print(header)
    print("-" * len(header))
    rows: list[Row] = []
    try:
        for bits in args.bits:
            eng, packed, setup = _engine(bits, args.n, args.dim, args.workers)
            ref = _phe(bits, args.n, args.dim)
            heu = _heu(bits, args.n, args.dim) if heu_reason is None else {}
            for op in OPS:
                rows.append(
                    {"bits": bits, "op": op, "engine_per_s": eng.get(op), "packed_per_s": packed.get(op)}
                    | {"phe_per_s": ref[op], "heu_per_s": heu.get(op)}
                )
                print(
                    f"{bits:>5} {op:<11} {_fmt(eng.get(op)):>10} {_fmt(packed.get(op)):>10} "
                    f"{_fmt(ref[op]):>9} {_fmt(heu.get(op)):>9} {_ratio(eng.get(op), ref[op]):>8} "
                    f"{_ratio(packed.get(op), ref[op]):>9} {_ratio(heu.get(op), ref[op]):>8}"
                )
            print(f"{bits:>5} (engine key generation + randomness table: {setup:.2f} s)")
    finally:
        shutdown_pools()
    write_json(args.json, rows, units="values/s (mat-vec: multiply-adds/s)", workers=args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
