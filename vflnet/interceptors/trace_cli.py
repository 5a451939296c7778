"""``vflnet trace ls|show|export RUN_OR_FILE``: look at what the taps of a run recorded.

``RUN_OR_FILE`` is one ``.trace`` file or a run directory (its ``traces/*.trace``; a folder holding
``*.trace`` files directly works too). ``show`` and ``export`` merge the files of a run by time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import heapq
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import Message

from vflnet.interceptors.events import DIRECTIONS, SIDES, WireEvent, short_name, walk_messages
from vflnet.interceptors.trace import SUFFIX, TraceError, read_trace, summarize
from vflnet.subcommands import add_action, run_action
from vflnet.v1 import messages_pb2, tensor_pb2


def find_traces(target: Path) -> list[Path]:
    """The trace files named by ``target`` (a file, a run directory or a traces directory)."""
    if target.is_file():
        return [target]
    if target.is_dir():
        return sorted((target / "traces").glob(f"*{SUFFIX}")) or sorted(target.glob(f"*{SUFFIX}"))
    raise FileNotFoundError(f"{target}: no such file or directory")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vflnet trace", description="Inspect and export wire traces.")
    sub = parser.add_subparsers(dest="trace_command", required=True)

    p = add_action(sub, "ls", _ls, "list trace files with record counts, sizes and methods")
    p.add_argument("target", type=Path, metavar="RUN_OR_FILE")

    filters = argparse.ArgumentParser(add_help=False)
    filters.add_argument("target", type=Path, metavar="RUN_OR_FILE")
    filters.add_argument(
        "--method",
        action="append",
        help="method, short (RunStep) or full (/vflnet.v1.Party/RunStep); repeatable",
    )
    filters.add_argument("--direction", choices=DIRECTIONS)
    filters.add_argument("--side", choices=SIDES)
    filters.add_argument("--party", action="append", help="only records written by this party; repeatable")
    filters.add_argument("--step", type=int, action="append", help="only messages of this step; repeatable")
    filters.add_argument("--limit", type=int, default=None, help="at most this many records")

    add_action(sub, "show", _show, "print one line per record", parents=[filters])
    p = add_action(
        sub, "export", _export, "write records' tensors and sample ids to an NPZ", parents=[filters]
    )
    p.add_argument("--out", type=Path, required=True, help="output .npz file")
    return parser


def select(events: Iterator[WireEvent], args: argparse.Namespace) -> Iterator[WireEvent]:
    """The events that pass the command line's filters, at most ``--limit`` of them."""
    methods = set(args.method or ())
    parties = set(args.party or ())
    steps = set(args.step or ())
    taken = 0
    for event in events:
        if args.limit is not None and taken >= args.limit:
            return
        if methods and not {event.method, short_name(event.method)} & methods:
            continue
        if args.direction and event.direction != args.direction:
            continue
        if args.side and event.side != args.side:
            continue
        if parties and event.party not in parties:
            continue
        if steps and event.step not in steps:
            continue
        taken += 1
        yield event


def merged_events(files: list[Path]) -> Iterator[WireEvent]:
    """All events of several trace files, in time order (each file is already in write order)."""
    # inspection shows a partial trace as it is (`ls` says it is partial)
    return heapq.merge(*(read_trace(f) for f in files), key=lambda e: e.time)


def _fmt_time(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S.%f")[:-3]


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _ls(args: argparse.Namespace) -> int:
    for path in args.files:
        s = summarize(path)
        header = s.headers[0] if s.headers else None
        who = f"party={header.party} run={header.run_id or '-'}" if header else "(empty)"
        notes = []
        if s.truncated:
            notes.append("TRUNCATED at cap")
        if s.partial_tail:
            notes.append("partial last entry")
        if len(s.headers) > 1:
            notes.append(f"{len(s.headers)} sessions")
        methods = ", ".join(f"{m}={n}" for m, n in sorted(s.methods.items()))
        print(f"{path}  {who}  records={s.records}  size={_human(s.size)}  {methods}")
        if notes:
            print(f"    {'; '.join(notes)}")
    return 0


def _show(args: argparse.Namespace) -> int:
    for event in select(merged_events(args.files), args):
        print(f"{_fmt_time(event.time)} {event.party} {event.describe()}")
    return 0


def _export(args: argparse.Namespace) -> int:
    events, out = select(merged_events(args.files), args), args.out
    columns: dict[str, list] = {
        k: [] for k in ("time", "party", "side", "direction", "method", "peer", "message_type", "sender")
    }
    numbers: dict[str, list[int]] = {k: [] for k in ("step", "batch_id", "epoch", "model_version")}
    arrays: dict[str, np.ndarray] = {}
    for i, event in enumerate(events):
        columns["time"].append(event.time)
        for key in ("party", "side", "direction", "method", "peer"):
            columns[key].append(getattr(event, key))
        columns["message_type"].append(event.message.DESCRIPTOR.full_name)
        columns["sender"].append(event.sender or "")
        for key in numbers:
            value = getattr(event, key)
            numbers[key].append(-1 if value is None else value)
        ids = event.sample_ids
        if ids is not None:
            arrays[f"rec{i}_sample_ids"] = ids
        for path, values in event.tensors().items():
            arrays[f"rec{i}_{path}"] = values
        for path, cipher in event.ciphertexts().items():
            width = max(cipher.width, 1)
            arrays[f"rec{i}_{path}"] = np.frombuffer(cipher.data, dtype=np.uint8).reshape(-1, width)
        arrays.update({f"rec{i}_{k}": v for k, v in _other_numbers(event.message).items()})
        arrays[f"rec{i}_fields"] = np.asarray(_fields_json(event.message))
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        out,
        time=np.asarray(columns.pop("time"), dtype=np.float64),
        **{k: np.asarray(v, dtype=np.str_) for k, v in columns.items()},
        **{k: np.asarray(v, dtype=np.int64) for k, v in numbers.items()},
        **arrays,
    )
    print(f"wrote {len(numbers['step'])} records to {out}")
    return 0


def _other_numbers(message: Message) -> dict[str, np.ndarray]:
    """Numbers a message carries outside tensors: repeated integer fields (a JoinReply's train and test
    IDs) and a DecryptReply's plaintext integers (as decimal strings: they may exceed 64 bits)."""
    out: dict[str, np.ndarray] = {}
    for fd, value in message.ListFields():
        if fd.is_repeated and fd.cpp_type in (fd.CPPTYPE_INT64, fd.CPPTYPE_UINT64, fd.CPPTYPE_INT32):
            if fd.name != "sample_ids" and fd.name != "shape":  # sample_ids are exported already
                out[fd.name] = np.asarray(value, dtype=np.int64)
    if isinstance(message, messages_pb2.DecryptReply) and message.integer_width:
        from vflnet.crypto.masking import ints_from_bytes

        ints = ints_from_bytes(message.integers, message.integer_width, tuple(message.shape))
        out["integers"] = np.asarray([str(v) for v in ints.reshape(-1)]).reshape(ints.shape)
    return out


def _fields_json(message: Message) -> str:
    """Every field of the message as JSON, bulk payloads (tensor and ciphertext data, decrypted
    integers) left out: they are their own arrays."""
    copy = type(message)()
    copy.CopyFrom(message)
    for kind in (tensor_pb2.Tensor, tensor_pb2.CipherTensor):
        for _, sub in walk_messages(copy, kind):
            sub.ClearField("data")
    if isinstance(copy, messages_pb2.DecryptReply):
        copy.ClearField("integers")
    return json_format.MessageToJson(copy, indent=None)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        files = find_traces(args.target)
    except FileNotFoundError as exc:
        print(f"vflnet trace: {exc}", file=sys.stderr)
        return 2
    if not files:
        print(
            f"vflnet trace: no *{SUFFIX} files in {args.target} or {args.target / 'traces'}", file=sys.stderr
        )
        return 2
    try:
        return run_action(argparse.Namespace(**vars(args), files=files))
    except TraceError as exc:
        print(f"vflnet trace: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
