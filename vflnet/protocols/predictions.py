"""What the active party does with the confidence vectors of evaluation and prediction steps, whatever
the protocol: in the PREDICT phase they pass its score defenses first (paper 003's rounding, an
outbound transform of the party that releases them) and then reach its attacks (paper 003's threat
model: the adversary receives the confidence vectors); it keeps them all and writes
<run>/predictions/{test,predict}-epoch-NNN.npz (sample_ids, predicted, confidence) at shutdown."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from vflnet.defenses.base import attach
from vflnet.durable import write_durable
from vflnet.threat.attack import PredictionView
from vflnet.v1 import messages_pb2


class PredictionsKeeper:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.defenses = attach(host.cfg, host.name, "scores")
        # (phase, epoch) -> [(ids, predicted class, confidence vector)]
        self.parts: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}

    def keep(
        self,
        cmd: messages_pb2.StepCommand,
        confidence: np.ndarray,
        rows: np.ndarray,
        own_model: Any,
        predicted: np.ndarray | None = None,
    ) -> np.ndarray:
        """Record one step's outputs; returns the confidence vectors as released (after the defenses)."""
        h, host = cmd.header, self.host
        ids = np.asarray(cmd.sample_ids, dtype=np.int64)
        if h.phase == messages_pb2.PREDICT:
            for defend in self.defenses:
                confidence = defend(confidence)
        predicted = confidence.argmax(1) if predicted is None else predicted
        self.parts.setdefault((h.phase, h.epoch), []).append((ids, predicted, confidence))
        if h.phase == messages_pb2.PREDICT:
            own = host.data.x[rows] if host.data.x is not None else np.zeros((len(rows), 0))
            host.interception.deliver_predictions(
                PredictionView(int(h.step), ids, confidence, own, own_model)
            )
        return confidence

    def write(self) -> None:
        out = self.host.run_dir / "predictions"
        for (phase, epoch), parts in self.parts.items():
            kind = "test" if phase == messages_pb2.EVAL else "predict"
            buf = io.BytesIO()
            np.savez(
                buf,
                sample_ids=np.concatenate([p[0] for p in parts]),
                predicted=np.concatenate([p[1] for p in parts]),
                confidence=np.concatenate([p[2] for p in parts]),
            )
            write_durable(out / f"{kind}-epoch-{epoch:03d}.npz", buf.getvalue(), "the predictions")
