"""Makes docs/images/fake-gradients-loss.png: param-server training on digits with and without fake gradients.

Run from the repository root: .venv/bin/python scripts/fake_gradients_curve.py (about 3 minutes)."""
import json
from pathlib import Path

import matplotlib
import yaml

matplotlib.use("Agg")
from matplotlib import pyplot as plt

from vflnet.runner.local import run_local

base = yaml.safe_load(open("configs/cafe-digits.yaml"))
base["protocol"] = {"kind": "param-server", "aggregation": "concat", "static": False}
base["train"].update(epochs=60, optimizer={"kind": "sgd", "lr": 0.1})
curves = {}
for name, defenses in [("without defense", []), ("fake gradients (sigma2 1e-4) at both passive parties",
                       [{"name": "fake-gradients", "party": p, "params": {"sigma2": 1e-4}} for p in ("passive-1", "passive-2")])]:
    d = dict(base, defenses=defenses); d["run"] = {"seed": 0, "dir": "/tmp/fgc"}
    tag = "plain" if not defenses else "fake"
    p = Path(f"/tmp/fgc/{tag}.yaml"); p.parent.mkdir(parents=True, exist_ok=True); p.write_text(yaml.safe_dump(d))
    run_local(p, run_dir=Path(f"/tmp/fgc/{tag}"), progress=False)
    L = [json.loads(l) for l in open(f"/tmp/fgc/{tag}/metrics.jsonl")]
    s = [x["loss"] for x in L if x["kind"] == "step"]
    sm = [sum(s[i:i+50])/len(s[i:i+50]) for i in range(0, len(s), 50)]
    score = json.load(open(f"/tmp/fgc/{tag}/attacks/scores.json"))["cafe@coordinator"]
    acc = [x for x in L if x["kind"] == "epoch"][-1].get("test_accuracy")
    curves[name] = (sm, score, acc)
    print(name, [round(v, 2) for v in sm], "psnr", round(score["psnr"], 2), "test acc", acc, flush=True)
fig, ax = plt.subplots(figsize=(7, 3.5))
for name, (sm, score, acc) in curves.items():
    ax.plot([i * 50 for i in range(len(sm))], sm, label=f"{name}: CAFE PSNR {score['psnr']:.1f} dB, test acc {acc:.2f}")
ax.set_xlabel("training step"); ax.set_ylabel("training loss (mean of 50 steps)"); ax.legend(fontsize=7); ax.set_title("param-server on digits, SGD lr 0.1")
fig.tight_layout(); fig.savefig("docs/images/fake-gradients-loss.png", dpi=110)
