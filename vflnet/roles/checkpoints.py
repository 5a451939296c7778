"""Coordinated checkpoints: every party saves step N, then the coordinator writes a manifest.

Layout in a run directory (each process writes only its own files; under compose each has its own
run directory and only the coordinator's holds the manifest):

    checkpoints/step-00000040/<party>.pt     a party's resume state after step 40
    checkpoints/step-00000040/coordinator.pt the schedule's cursor and the coordinator side's state
    checkpoints/step-00000040/MANIFEST.json  written last: step, epoch and every file's SHA-256

A checkpoint is valid only through its manifest: the manifest is written after every party has
reported its file's digest, atomically (temporary file, fsync, rename, fsync of the directory), and
each file is checked against its digest before it is loaded, so a file cut at any byte, or a step
whose manifest was never written, is never used. ``checkpoints/<party>.pt`` (without a step) is the
final model a party saves at shutdown, which reproductions and benchmarks read.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflnet.durable import write_durable

log = logging.getLogger("vflnet.checkpoints")

MANIFEST = "MANIFEST.json"
KEEP = 2  # manifested checkpoints kept per run directory; older ones are removed


class CheckpointInvalid(ValueError):
    """A checkpoint file or manifest that is missing, cut short, or not the one the manifest names."""


@dataclass(frozen=True)
class Manifest:
    run_id: str
    step: int
    epoch: int
    files: dict[str, str]  # process name -> SHA-256 of its step file


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:08d}"


def save_state(path: Path, state: dict[str, Any], what: str = "a checkpoint") -> str:
    """torch.save ``state`` durably to ``path``; returns the file's SHA-256."""
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    write_durable(path, data, what)
    return hashlib.sha256(data).hexdigest()


def verified_bytes(path: Path, sha256: str) -> bytes:
    """The bytes of ``path`` if they are exactly those the manifest names."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointInvalid(f"cannot read checkpoint {path}: {exc.strerror}") from exc
    if hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointInvalid(
            f"checkpoint {path} does not match its manifest (cut short, changed, or from another run)"
        )
    return data


def load_state(path: Path, sha256: str) -> dict[str, Any]:
    """The state in ``path`` if its bytes are exactly those the manifest names."""
    # weights_only=False: the file is our own, and its digest is checked against the manifest first
    return torch.load(io.BytesIO(verified_bytes(path, sha256)), weights_only=False)


def write_manifest(run_dir: Path, manifest: Manifest) -> Path:
    path = step_dir(run_dir, manifest.step) / MANIFEST
    data = json.dumps(asdict(manifest), indent=2, sort_keys=True).encode()
    write_durable(path, data, f"the manifest of the checkpoint of step {manifest.step}")
    return path


def read_manifest(path: Path, run_id: str) -> Manifest:
    try:
        raw = json.loads(path.read_text())
        manifest = Manifest(
            run_id=str(raw["run_id"]),
            step=int(raw["step"]),
            epoch=int(raw["epoch"]),
            files={str(k): str(v) for k, v in dict(raw["files"]).items()},
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointInvalid(f"{path} is not a valid checkpoint manifest: {exc}") from exc
    if manifest.run_id != run_id:
        raise CheckpointInvalid(f"{path} belongs to run {manifest.run_id!r}, not {run_id!r}")
    return manifest


def newest_valid(
    run_dir: Path, run_id: str, own: str, every_file: bool = False
) -> tuple[Manifest | None, list[str]]:
    """The newest checkpoint whose manifest is valid and whose files all match it, and why each newer
    one was skipped (the step and the file). Process ``own``'s file must be here; every other file the
    manifest names is checked where this directory holds it, or, with ``every_file``, must be here
    (`vflnet run`: one run directory holds every process's files). Where each process has its own
    directory (compose) the coordinator checks its own file, and each party checks its own on
    admission."""
    root = run_dir / "checkpoints"
    steps = sorted(root.glob("step-*/" + MANIFEST), reverse=True) if root.is_dir() else []
    skipped = []
    for path in steps:
        try:
            manifest = read_manifest(path, run_id)
            if step_dir(run_dir, manifest.step) != path.parent:
                raise CheckpointInvalid(f"{path} names step {manifest.step}, not its directory's")
            if own not in manifest.files:
                raise CheckpointInvalid(f"{path} names no file of {own!r}")
            for name, sha256 in sorted(manifest.files.items()):
                file = path.parent / f"{name}.pt"
                if (name == own or every_file) and not file.exists():
                    raise CheckpointInvalid(f"checkpoint {file} of {name!r} is missing")
                if file.exists():
                    verified_bytes(file, sha256)
            return manifest, skipped
        except CheckpointInvalid as exc:
            skipped.append(f"{path.parent.name}: {exc}")
    return None, skipped


def none_valid(skipped: list[str]) -> str:
    """What to say when checkpoints exist and none of them is valid."""
    return (
        "no valid checkpoint to resume from: "
        + "; ".join(skipped)
        + ". Remove those step directories under checkpoints/ to start the run over"
    )


def latest_manifest(run_dir: Path, run_id: str, own: str) -> Manifest | None:
    """``newest_valid``'s checkpoint, each one skipped logged."""
    manifest, skipped = newest_valid(run_dir, run_id, own)
    for why in skipped:
        log.warning("skipping checkpoint %s", why)
    return manifest


def prune(run_dir: Path, keep_from: int) -> None:
    """Remove step directories older than step ``keep_from`` (the oldest checkpoint still kept)."""
    root = run_dir / "checkpoints"
    for d in root.glob("step-*"):
        try:
            step = int(d.name.removeprefix("step-"))
        except ValueError:
            continue
        if step < keep_from:
            shutil.rmtree(d, ignore_errors=True)


def prune_after_party_save(run_dir: Path, saved_steps: list[int]) -> None:
    """A party's pruning after it saved ``saved_steps[-1]``: it keeps one checkpoint more than the
    coordinator, since the step just saved has no manifest yet (the coordinator writes it once every
    party has saved) and a run that dies before then resumes from the KEEP manifested ones before it."""
    if len(saved_steps) > KEEP + 1:
        prune(run_dir, saved_steps[-KEEP - 1])


def drop_after(run_dir: Path, step: int) -> None:
    """Remove checkpoints newer than ``step`` (a resumed run replaces them)."""
    root = run_dir / "checkpoints"
    for d in root.glob("step-*"):
        try:
            newer = int(d.name.removeprefix("step-")) > step
        except ValueError:
            continue
        if newer:
            shutil.rmtree(d, ignore_errors=True)


# ----------------------------------------------------------------------------- RNG state
def global_rng_state() -> dict[str, Any]:
    """The process-wide generators (torch: dropout, init; numpy and random: anything that uses them)."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_global_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def generator_states(root: object, depth: int = 3) -> dict[str, Any]:
    """Every seeded generator (torch.Generator, numpy Generator) reachable from ``root`` through
    attributes, lists and dicts of vflnet objects, by path: defenses and protocol parts draw their
    noise from their own generators, and a resumed run must continue each one where it stopped."""
    found: dict[str, Any] = {}
    _walk(root, "", depth, found, set())
    return found


def restore_generators(root: object, states: dict[str, Any]) -> None:
    live: dict[str, Any] = {}
    _walk(root, "", 3, live, set(), keep_objects=True)
    missing = sorted(set(states) - set(live))
    if missing:
        raise CheckpointInvalid(f"the checkpoint has generator state for {missing}, which this run lacks")
    for path, gen in live.items():
        if path not in states:
            continue
        if isinstance(gen, torch.Generator):
            gen.set_state(states[path])
        else:
            gen.bit_generator.state = states[path]


def _walk(
    obj: Any, path: str, depth: int, out: dict[str, Any], seen: set[int], keep_objects: bool = False
) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Generator):
        out[path] = obj if keep_objects else obj.get_state()
        return
    if isinstance(obj, np.random.Generator):
        out[path] = obj if keep_objects else obj.bit_generator.state
        return
    if depth == 0:
        return
    if isinstance(obj, dict):
        children = [(str(k), v) for k, v in obj.items()]
    elif isinstance(obj, list | tuple):
        children = [(str(i), v) for i, v in enumerate(obj)]
    elif type(obj).__module__.startswith("vflnet.") and hasattr(obj, "__dict__"):
        # the host is the side's owner, not its part: its other parts are checkpointed on their own
        children = [(k, v) for k, v in vars(obj).items() if k not in ("host", "cfg")]
    else:
        return
    for key, child in children:
        _walk(child, f"{path}.{key}" if path else key, depth - 1, out, seen, keep_objects)
