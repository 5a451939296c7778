"""`vflnet bench cafe`: seconds per CAFE iteration (paper 002) at the paper's setting, on the CPU and,
where torch sees one, on a GPU.

Two figures per device, side by side with their baseline:
- the attack alone ("offline"): Steps I-III on observations of a static victim (the authors' model,
  N images, batches of K), what one iteration of the attacker costs;
- a real `param-server` training step with the `cafe` tap at the coordinator (loopback bridge, the
  attack on its own thread), against the same step without the attack: what a user of
  `vflnet reproduce cafe` waits per iteration. The attack trails the protocol by up to two
  observations, so what it adds per step is the difference of the two runs' wall times per step.

The paper's setting (N 800, K 40, M 4, conv 64/128, fc1 256) costs 2-3 s per iteration on two
loaded CPU cores; `--smoke` runs tiny sizes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from vflnet.attacks.cafe import CafeAttack, ServerObservation, table9_params
from vflnet.models.cafe_net import CafeNetConfig, CafeVFL, grid_for, party_gradients, party_parameters
from vflnet.runner.loopback import run_loopback
from vflnet.tools.bench.common import Row, markdown_table, parse_args, scratch, write_json
from vflnet.tools.reproduce.cafe import (
    IMAGE_SIDE,
    RunSettings,
    attack_params,
    config_in,
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


def run_s(
    n: int, k: int, m: int, conv: tuple[int, int], fc1: int, device: str, steps: int, attack: bool, out: Path
) -> tuple[float, float]:
    """A real param-server run of ``steps`` steps, with or without the CAFE tap: its wall time (set-up,
    the steps, and with the tap the attack's last iterations, which the run's end waits for) and its
    median step."""
    run = RunSettings(n, m, steps, worker_model(conv, fc1), eval_every=0, device=device)
    data = run_config(
        n=n,
        k=k,
        m=m,
        iterations=steps,
        bottom=run.bottom,
        attack=attack_params(k, "cafe", run) if attack else None,
    )
    run_dir = out / f"{'attack' if attack else 'plain'}-{device}"
    run_dir.mkdir(parents=True)
    start = time.perf_counter()
    run_loopback(config_in(data, run_dir), run_dir)
    wall = time.perf_counter() - start
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return wall, median_step_s([r for r in records if r["kind"] == "step"])


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
    parser.add_argument("--steps", type=int, default=10, help="training steps of each run")
    args = parse_args(
        parser,
        argv,
        smoke={"n": 16, "k": 4, "conv_channels": [2, 4], "fc1_out": 8, "iterations": 2, "steps": 4},
    )
    # one intra-op thread, as every role of the runs (runtime.torch_threads): on a loaded 2-core machine
    # two spinning OpenMP threads make an iteration several times slower, not faster
    torch.set_num_threads(1)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    size = (args.n, args.k, args.m, tuple(args.conv_channels), args.fc1_out)
    rows: list[Row] = []
    with scratch("vflnet-bench-cafe-") as tmp:
        for attack in (False, True):  # one-off costs (the data, torch.func's first use) out of the way
            run_s(*size, "cpu", 1, attack, Path(tmp) / "warm-up")
        # no attack: the device plays no part (the parties train on the CPU)
        plain_wall, plain_step = run_s(*size, "cpu", args.steps, False, Path(tmp))
        for device in devices:
            # the attack runs on its own thread behind the protocol (a queue of two observations), so a
            # step's own time hides it: what it adds per step is the difference of the runs' wall times
            wall, _ = run_s(*size, device, args.steps, True, Path(tmp))
            rows.append(
                {
                    "attack_on": device,
                    "n_k_m": f"{args.n}, {args.k}, {args.m}",
                    "attack_iteration_ms": 1e3 * offline_iteration_s(*size, device, args.iterations),
                    "step_without_attack_ms": 1e3 * plain_step,  # the baseline: protocol and training alone
                    # what a user of `reproduce cafe` waits more per iteration (noise: it may be < 0 at tiny sizes)
                    "attack_adds_ms_per_step": 1e3 * (wall - plain_wall) / args.steps,
                }
            )
    print(markdown_table(rows))
    if not torch.cuda.is_available():
        print("\nno GPU visible to torch: CPU only")
    write_json(args.json, rows, torch=torch.__version__, threads=torch.get_num_threads())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
