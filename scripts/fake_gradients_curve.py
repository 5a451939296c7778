"""Makes docs/images/fake-gradients-loss.png: param-server training on digits with and without fake gradients.

Run from the repository root: .venv/bin/python scripts/fake_gradients_curve.py (about 3 minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import yaml

from vflnet.runner.local import run_local

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402

WORK = Path("/tmp/vflnet-fake-gradients-curve")
FAKE = [
    {"name": "fake-gradients", "party": p, "params": {"sigma2": 1e-4}} for p in ("passive-1", "passive-2")
]


def run(tag: str, defenses: list[dict]) -> tuple[list[float], float, float]:
    data = yaml.safe_load(Path("configs/cafe-digits.yaml").read_text())
    data["protocol"] = {"kind": "param-server", "aggregation": "concat", "params": {"static": False}}
    data["train"].update(epochs=60, optimizer={"kind": "sgd", "lr": 0.1})
    data["defenses"] = defenses
    data["run"] = {"seed": 0, "dir": str(WORK)}
    path = WORK / f"{tag}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    run_local(path, run_dir=WORK / tag, progress=False)
    records = [json.loads(line) for line in (WORK / tag / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "step"]
    means = [sum(losses[i : i + 50]) / len(losses[i : i + 50]) for i in range(0, len(losses), 50)]
    psnr = json.loads((WORK / tag / "attacks/scores.json").read_text())["cafe@coordinator"]["psnr"]
    accuracy = [r for r in records if r["kind"] == "epoch"][-1]["test_accuracy"]
    return means, psnr, accuracy


def main() -> None:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for label, tag, defenses in [
        ("without defense", "plain", []),
        ("fake gradients (sigma2 1e-4) at both passive parties", "fake", FAKE),
    ]:
        means, psnr, accuracy = run(tag, defenses)
        ax.plot(
            [i * 50 for i in range(len(means))],
            means,
            label=f"{label}: CAFE PSNR {psnr:.1f} dB, test acc {accuracy:.2f}",
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss (mean of 50 steps)")
    ax.set_title("param-server on digits, SGD lr 0.1")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig("docs/images/fake-gradients-loss.png", dpi=110)


if __name__ == "__main__":
    main()
