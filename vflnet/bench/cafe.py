"""`vflnet bench cafe`: seconds per CAFE iteration (paper 002) at the paper's setting, on the CPU and,
where torch sees one, on a GPU.

Two figures per device, side by side with their baseline:
- the attack alone ("offline"): Steps I-III on observations of a static victim (the authors' model,
  N images, batches of K), what one iteration of the attacker costs;
- a real `param-server` training step with the `cafe` tap at the coordinator (loopback bridge, the
  attack on its own thread), against the same step without the attack: what a user of
  `vflnet reproduce cafe` waits per iteration, and the protocol's share of it.

The paper's setting (N 800, K 40, M 4, conv 64/128, fc1 256) costs 2-3 s per iteration on two
loaded CPU cores; `--smoke` runs tiny sizes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from vflnet.attacks.cafe import CafeAttack, ServerObservation, table9_params
from vflnet.bench.common import Row, markdown_table, parse_args, write_json
from vflnet.models.cafe_net import CafeNetConfig, CafeVFL, grid_for, party_gradients, party_parameters
from vflnet.reproduce.cafe import (
    IMAGE_SIDE,
    RunSettings,
    attack_params,
    execute,
    median_step_s,
    run_config,
    worker_model,
)


def offline_iteration_s(
    n: int, k: int, m: int, conv: tuple[int, int], fc1: int, device: str, iterations: int
) -> float:
    """Median seconds of one attack iteration on observations of a static victim (two warm-ups)."""
    rows, cols = grid_for(m)
    side = IMAGE_SIDE["mnist"]
    cfg = CafeNetConfig(
        region_shape=(1, side // rows, side // cols), n_workers=m, conv_channels=conv, fc1_out=fc1
    )
    torch.manual_seed(0)
    victim = CafeVFL(cfg)
    images, labels = torch.rand(n, m, *cfg.region_shape), torch.randint(0, cfg.n_classes, (n,))
    rng = np.random.default_rng(0)
    params = party_parameters(victim)
    attack = CafeAttack(table9_params("mnist", n_samples=n), CafeVFL(cfg), device=device)
    times = []
    for t in range(iterations + 2):
        ids = np.sort(rng.choice(n, k, replace=False))
        _, grads = party_gradients(victim, list(images[ids].unbind(1)), labels[ids])
        start = time.perf_counter()
        attack.observe(ServerObservation(t, ids, params, grads))
        if attack.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return float(np.median(times[2:]))


QUEUED = 4  # steps left out of the median: the first (set-up) and those that fill the attack's queue


def step_s(
    n: int, k: int, m: int, conv: tuple[int, int], fc1: int, device: str, steps: int, attack: bool, out: Path
) -> float:
    """Median seconds of a training step of a real param-server run, with or without the CAFE tap."""
    run = RunSettings(n, m, steps, worker_model(conv, fc1), eval_every=0, device=device)
    data = run_config(
        n=n,
        k=k,
        m=m,
        iterations=steps,
        bottom=run.bottom,
        attack=attack_params(k, "cafe", run) if attack else None,
    )
    records = execute(data, out / f"{'attack' if attack else 'plain'}-{device}").steps
    # the attack runs on its own thread, up to two observations behind: the first steps do not wait for
    # it; once its queue is full each step waits for one iteration (the steady state)
    return median_step_s(records[QUEUED:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vflnet bench cafe", description=__doc__)
    parser.add_argument("--n", type=int, default=800, help="training images N")
    parser.add_argument("--k", type=int, default=40, help="batch size K")
    parser.add_argument("--m", type=int, default=4, help="workers M")
    parser.add_argument("--conv-channels", type=int, nargs=2, default=[64, 128])
    parser.add_argument("--fc1-out", type=int, default=256)
    parser.add_argument(
        "--iterations", type=int, default=4, help="timed attack iterations (after 2 warm-ups)"
    )
    parser.add_argument(
        "--steps", type=int, default=10, help=f"training steps of each run (the first {QUEUED + 1} not timed)"
    )
    args = parse_args(
        parser,
        argv,
        smoke={"n": 16, "k": 4, "conv_channels": [2, 4], "fc1_out": 8, "iterations": 2, "steps": QUEUED + 3},
    )
    # one intra-op thread, as every role of the runs (runtime.torch_threads): on a loaded 2-core machine
    # two spinning OpenMP threads make an iteration several times slower, not faster
    torch.set_num_threads(1)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    size = (args.n, args.k, args.m, tuple(args.conv_channels), args.fc1_out)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="vflnet-bench-cafe-") as tmp:
        plain = step_s(*size, "cpu", args.steps, False, Path(tmp))  # no attack: the device plays no part
        for device in devices:
            with_attack = step_s(*size, device, args.steps, True, Path(tmp))
            rows.append(
                {
                    "attack_on": device,
                    "n_k_m": f"{args.n}, {args.k}, {args.m}",
                    "attack_iteration_ms": 1e3 * offline_iteration_s(*size, device, args.iterations),
                    "step_with_attack_ms": 1e3 * with_attack,
                    "step_without_attack_ms": 1e3 * plain,  # the baseline: protocol and training alone
                    "attack_share": 1 - plain / with_attack,  # noise can make it negative at tiny sizes
                }
            )
    print(markdown_table(rows))
    if not torch.cuda.is_available():
        print("\nno GPU visible to torch: CPU only")
    write_json(args.json, rows, torch=torch.__version__, threads=torch.get_num_threads())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
