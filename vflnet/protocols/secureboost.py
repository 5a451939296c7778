"""SecureBoost-style vertical trees: the `secureboost` protocol (Cheng et al., 2019; paper 003's trees).

One training step grows one tree over the step's rows (`train.batch_size` at least the training set:
one tree per epoch; smaller batches: one tree per batch, the row subsampling of a random forest).
The label holder (active party) computes the rows' gradient statistics (vflnet.models.secureboost)
and sends them to every passive party (``StartTree``): in the HE mode (g_1..g_c, h_1..h_c) of a row
packed into one Paillier ciphertext under its own key, in the plain mode as fixed-point integers.
Level by level it sends the rows' node assignment (``Histograms``); each passive party answers the
cumulative histograms of the open nodes over its own features (ciphertext additions on the engine's
arrays, features split over `protocol.params.workers` processes); the label holder decrypts, scores
every party's candidates and its own, and asks the owner of the best one to split (``Split``): the
owner keeps (feature, threshold) under a split id and returns which of the node's rows go left.

Evaluation and prediction steps: the label holder asks every party to evaluate its own splits on
the step's samples (``Route``: go-left bits per split id it owns), walks the trees and keeps the
confidence vector per sample (forest: vote shares, one tree: one-hot; boost: softmax of the leaf
sums). Like SecureBoost's prediction, this shows the label holder each sample's path, never a
threshold of another party. In the PREDICT phase the confidence vectors go through the active
party's score defenses (rounding) and then to its attacks (paper 003's threat model).

Bad input: a passive party answers a malformed request (unknown sample ids, a wrong-size node
assignment, gh under another key than the run's, an unknown split candidate or split id) with
INVALID_ARGUMENT, NOT_FOUND or FAILED_PRECONDITION and keeps serving; a malformed or wrong-size
histogram or split reply fails the label holder's step with DATA_LOSS naming the party, and the
coordinator stops the run.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vflnet.config import TRAIN_KEYS, Config
from vflnet.crypto import PaillierOverflowError, PublicKey, encoding, generate_keypair
from vflnet.crypto.wire import cipher_from_proto, cipher_to_proto
from vflnet.durable import write_durable
from vflnet.models.secureboost import (
    FRAC_BITS,
    Ensemble,
    LocalParty,
    TreeParams,
    grow_tree,
    packed_shape,
    tree_gradients,
    unpack_histograms,
)
from vflnet.protocols.he_settings import HE_PARAMS, he_settings, insecure_key_problem
from vflnet.protocols.predictions import PredictionsKeeper
from vflnet.registry import read_when
from vflnet.sdk import (
    PROTOCOLS,
    CoordinatorSide,
    Param,
    PartySide,
    Pending,
    Protocol,
    deadlines,
    handles,
    invalid,
    malformed,
    not_found,
    register_messages,
    send,
    wrong_state,
)
from vflnet.v1 import messages_pb2, secureboost_pb2
from vflnet.wire import tensors
from vflnet.wire.ciphers import cipher_from_proto_checked
from vflnet.wire.tensors import PayloadError

log = logging.getLogger("vflnet.secureboost")

SERVICE = secureboost_pb2.DESCRIPTOR.services_by_name["SecureBoost"]
START = "/vflnet.secureboost.SecureBoost/StartTree"
HISTOGRAMS = "/vflnet.secureboost.SecureBoost/Histograms"
SPLIT = "/vflnet.secureboost.SecureBoost/Split"
ROUTE = "/vflnet.secureboost.SecureBoost/Route"
register_messages(SERVICE)


def tree_params(cfg: Config) -> TreeParams:
    p = cfg.protocol.params
    return TreeParams(
        max_depth=int(p["max_depth"]),
        n_bins=int(p["n_bins"]),
        reg_lambda=float(p["reg_lambda"]),
        min_child_weight=float(p["min_child_weight"]),
        ensemble=str(p["ensemble"]),
        # boost only: under forest the checked params leave it out (vflnet.registry.validate_params)
        **({"learning_rate": float(p["learning_rate"])} if "learning_rate" in p else {}),
    )


def gh_slots(public_key: PublicKey, n_rows: int) -> int:
    """Slots per ciphertext, each wide enough for a sum of g or h over every row: a row's k values use
    the first k; a passive party packs slots // k histogram entries into one ciphertext."""
    value_bits = FRAC_BITS + max(1, n_rows).bit_length() + 2
    return max(1, encoding.max_slots(public_key.bits, value_bits))


# ------------------------------------------------------------------------------ passive
def tree_work_s(cfg: Config, rows: int, features: int, encrypt_rows: bool) -> float:
    """One tree's work for a party's features (vflnet/sdk/deadlines.py): per level, every row's gh
    added into a bucket of every feature, the open nodes' histograms decrypted by the label holder
    (counted here, with the features they cover); the label holder's gh encryptions, one per row."""
    p, bits = tree_params(cfg), he_settings(cfg).key_bits
    rows = min(rows, cfg.train.batch_size)
    if cfg.protocol.params["mode"] != "he":
        return p.max_depth * rows * features * deadlines.NUMPY_VALUE_S
    buckets = 2**p.max_depth * features * p.n_bins
    return (
        deadlines.paillier_s("add", bits, p.max_depth * rows * features + buckets)
        + deadlines.paillier_s("decrypt", bits, buckets)
        + (deadlines.paillier_s("encrypt", bits, rows) if encrypt_rows else 0.0)
    )


class SecureBoostCoordinator(CoordinatorSide):
    """The label holder's step first: it grows the tree through the passive parties' services. The
    passive parties' own step commands follow, so a checkpoint they save after one holds every split
    of the step's tree (sent at once, a passive party could save before the tree's last split)."""

    def waves(self, parties: list[str]) -> list[list[str]]:
        active = [self.cfg.active.name]
        return [active, [p for p in parties if p not in active]]


class SecureBoostPassive(PartySide):
    """Histograms over its own features from the label holder's gh; keeps its thresholds."""

    def step_work_s(self) -> float:
        x = self.host.data.x
        assert x is not None
        return tree_work_s(self.cfg, x.shape[0], int(np.prod(x.shape[1:])), encrypt_rows=False)

    def joined(self, reply: messages_pb2.JoinReply) -> None:
        host = self.host
        assert host.data.x is not None
        train_rows = host.data.rows(np.asarray(reply.train_ids, dtype=np.int64))
        self.party = LocalParty.fit(
            host.data.x, train_rows, tree_params(self.cfg).n_bins, he_settings(self.cfg).workers
        )
        self.he = self.cfg.protocol.params["mode"] == "he"
        self.public_key: PublicKey | None = None  # the label holder's, pinned by its first tree
        self.tree_step = -1  # the step whose tree is being grown (histograms and splits must belong to it)
        self.lock = threading.Lock()

    def _rows(self, ids: Sequence[int]) -> np.ndarray:
        try:
            return self.host.data.rows(np.asarray(ids, dtype=np.int64))
        except KeyError as exc:
            raise invalid(str(exc).strip('"')) from exc

    def _gh(self, req: secureboost_pb2.TreeStart, n: int) -> Any:
        kind = req.WhichOneof("gh")
        if kind != ("cipher" if self.he else "plain"):
            raise invalid(f"secureboost runs in {'he' if self.he else 'plain'} mode; got {kind} gradients")
        if not self.he:
            gh = tensors.from_proto(req.plain, expect_dtype="int64", what="gradient statistics")
            if gh.ndim != 2 or gh.shape[0] != n or gh.shape[1] < 2 or gh.shape[1] % 2:
                raise invalid(f"gradient statistics of shape {gh.shape} for {n} rows (expected [n, 2c])")
            return gh
        try:
            key = PublicKey.from_json(json.loads(req.public_key))
        except (ValueError, KeyError, TypeError) as exc:
            raise invalid(f"malformed public key: {exc}") from exc
        if self.public_key is None:
            self.public_key = key
        elif key != self.public_key:
            raise invalid("the label holder's public key changed during the run")
        try:
            gh = cipher_from_proto(req.cipher, self.public_key)
        except ValueError as exc:
            raise invalid(f"gradient statistics: {exc}") from exc
        if gh.ndim != 2 or gh.shape[0] != n or gh.shape[1] < 2 or gh.shape[1] % 2:
            raise invalid(f"gradient statistics of shape {gh.shape} for {n} rows (expected [n, 2c])")
        return gh

    @handles(START, callers={"active"}, wait_for_admission=True)
    def start_tree(self, req: secureboost_pb2.TreeStart, context: Any) -> secureboost_pb2.TreeStartAck:
        rows = self._rows(req.sample_ids)
        gh = self._gh(req, len(rows))
        with self.lock:
            self.party.start_tree(rows, gh)
            self.tree_step = req.header.step
        return secureboost_pb2.TreeStartAck(header=self.host.header(req.header))

    @handles(HISTOGRAMS, callers={"active"}, wait_for_admission=True)
    def histograms(
        self, req: secureboost_pb2.HistogramRequest, context: Any
    ) -> secureboost_pb2.HistogramReply:
        with self.lock:
            if req.header.step != self.tree_step:
                raise wrong_state(f"no tree started at step {req.header.step}")
            n = len(self.party.rows)
            node_of = tensors.from_proto(
                req.node_of, expect_dtype="int64", expect_shape=(n,), what="node assignment"
            )
            nodes = list(req.nodes)
            if not nodes or len(set(nodes)) != len(nodes) or min(nodes) < 0:
                raise invalid(f"histograms need distinct non-negative nodes, got {nodes}")
            sums = self.party.histograms(node_of, nodes)
            reply = secureboost_pb2.HistogramReply(
                header=self.host.header(req.header), candidates=self.party.n_candidates
            )
            if self.he:
                reply.cipher.CopyFrom(cipher_to_proto(sums, workers=he_settings(self.cfg).workers))
            else:
                reply.plain.CopyFrom(tensors.to_proto(sums))
        return reply

    def state_dict(self) -> dict[str, Any]:
        """Its split table and the label holder's key it pinned (a checkpoint falls between trees)."""
        return {
            "features": list(self.party.features),
            "cuts": list(self.party.cuts),
            "public_key": self.public_key,
            "tree_step": self.tree_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.party.features, self.party.cuts = list(state["features"]), list(state["cuts"])
        self.public_key, self.tree_step = state["public_key"], int(state["tree_step"])

    @handles(SPLIT, callers={"active"}, wait_for_admission=True)
    def split(self, req: secureboost_pb2.SplitRequest, context: Any) -> secureboost_pb2.SplitReply:
        with self.lock:
            if req.header.step != self.tree_step or req.node not in self.party.nodes:
                raise wrong_state(f"node {req.node} is not open in the current level")
            try:
                split_id, left = self.party.split(int(req.node), int(req.candidate))
            except IndexError as exc:
                raise invalid(f"unknown split candidate: {exc}") from exc
            self.host.local.modules["bottom"].set(self.party.features, self.party.cuts)
        reply = secureboost_pb2.SplitReply(
            header=self.host.header(req.header), split_id=split_id, go_left=tensors.to_proto(left)
        )
        return reply

    @handles(ROUTE, callers={"active"}, wait_for_admission=True)
    def route(self, req: secureboost_pb2.RouteRequest, context: Any) -> secureboost_pb2.RouteReply:
        rows = self._rows(req.sample_ids)
        with self.lock:
            try:
                bits = self.party.route(rows, np.asarray(req.split_ids, dtype=np.int64))
            except IndexError as exc:
                raise not_found(str(exc)) from exc
        reply = secureboost_pb2.RouteReply(
            header=self.host.header(req.header), go_left=tensors.to_proto(bits)
        )
        return reply

    def step(self, cmd: messages_pb2.StepCommand, rows: np.ndarray) -> dict[str, float]:
        return {}  # the work happens when the label holder calls (maybe before this command arrives)


# ------------------------------------------------------------------------------- active
class RemoteParty:
    """A passive party as the label holder's tree-growing loop sees it, over the wire."""

    def __init__(self, side: SecureBoostActive, name: str, channel: Any) -> None:
        self.side, self.name, self.channel = side, name, channel

    def _call(self, method: str, req: Any) -> Pending:
        return send(self.side.host, self.channel, self.name, method, req)

    def ask_histograms(self, node_of: np.ndarray, nodes: list[int]) -> Any:
        req = secureboost_pb2.HistogramRequest(
            header=self.side.host.header(self.side.host.current),
            node_of=tensors.to_proto(node_of),
            nodes=nodes,
        )
        return self._call(HISTOGRAMS, req)

    def decode_histograms(self, future: Any, n_nodes: int, k: int) -> np.ndarray:
        reply = future.result()
        what = f"histograms from {self.name}"
        try:
            cands = list(reply.candidates)
            if any(c < 0 for c in cands):
                raise PayloadError(f"{what}: negative candidate counts {cands}")
            shape = (n_nodes, int(sum(cands)), k)
            if self.side.private_key is not None:
                if reply.WhichOneof("sums") != "cipher":
                    raise PayloadError(f"{what}: plaintext sums in the HE mode")
                sent = packed_shape(*shape, self.side.slots)
                ca = cipher_from_proto_checked(reply.cipher, self.side.private_key.public_key, sent, what)
                if ca.slots != self.side.slots:
                    raise PayloadError(f"{what}: {ca.slots} slots per ciphertext, expected {self.side.slots}")
                ints = self.side.private_key.decrypt_encoded(ca, workers=he_settings(self.side.cfg).workers)
                return unpack_histograms(np.asarray(ints, dtype=np.int64), shape[1], k)
            if reply.WhichOneof("sums") != "plain":
                raise PayloadError(f"{what}: ciphertexts in the plain mode")
            return tensors.from_proto(reply.plain, expect_dtype="int64", expect_shape=shape, what=what)
        except (PayloadError, PaillierOverflowError, ValueError, OverflowError) as exc:
            raise malformed(f"malformed histograms from {self.name}: {exc}") from exc

    def split(self, node: int, candidate: int) -> tuple[int, np.ndarray]:
        req = secureboost_pb2.SplitRequest(
            header=self.side.host.header(self.side.host.current), node=node, candidate=candidate
        )
        reply = self._call(SPLIT, req).result()
        try:
            left = tensors.from_proto(reply.go_left, expect_dtype="bool", what=f"split from {self.name}")
        except PayloadError as exc:
            raise malformed(str(exc)) from exc
        return int(reply.split_id), left

    def route(self, ids: np.ndarray, split_ids: np.ndarray) -> np.ndarray:
        req = secureboost_pb2.RouteRequest(
            header=self.side.host.header(self.side.host.current), sample_ids=ids, split_ids=split_ids
        )
        reply = self._call(ROUTE, req).result()
        try:
            return tensors.from_proto(
                reply.go_left,
                expect_dtype="bool",
                expect_shape=(len(split_ids), len(ids)),
                what=f"routing from {self.name}",
            )
        except PayloadError as exc:
            raise malformed(str(exc)) from exc


class SecureBoostActive(PartySide):
    """The label holder: gradients, split finding over every party's histograms, the trees."""

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self.params = tree_params(self.cfg)
        self.keeper = PredictionsKeeper(host)

    def step_work_s(self) -> float:
        data = self.host.data
        features = int(np.prod(data.x.shape[1:])) if data.x is not None else 0
        return tree_work_s(self.cfg, len(data.ids), features, encrypt_rows=True)

    def joined(self, reply: messages_pb2.JoinReply) -> None:
        host, cfg = self.host, self.cfg
        address = {p.name: p.address for p in reply.roster}
        self.remotes = [
            RemoteParty(self, p.name, host.channel(address[p.name], p.name)) for p in cfg.passives
        ]
        self.train_rows = host.data.rows(np.asarray(reply.train_ids, dtype=np.int64))
        self.own = (
            LocalParty.fit(host.data.x, self.train_rows, self.params.n_bins, he_settings(cfg).workers)
            if host.data.x is not None
            else None
        )
        self.parties: list[Any] = ([self.own] if self.own is not None else []) + list(self.remotes)
        self.owner_names = ([host.name] if self.own is not None else []) + [r.name for r in self.remotes]
        self.ensemble = Ensemble(host.data.n_classes, self.params)
        self.scores = np.zeros((len(host.data.ids), host.data.n_classes))
        self.public_key, self.private_key = None, None
        if cfg.protocol.params["mode"] == "he":
            he = he_settings(cfg)
            start = time.perf_counter()
            self.public_key, self.private_key = generate_keypair(
                he.key_bits, allow_insecure=he.allow_insecure_keys
            )
            log.info("%s: %d-bit Paillier key in %.1f s", host.name, he.key_bits, time.perf_counter() - start)
        self.pool = ThreadPoolExecutor(max_workers=max(1, len(self.remotes)))

    # ------------------------------------------------------------------------ training
    def _start_tree(self, ids: np.ndarray, rows: np.ndarray, gh: np.ndarray) -> None:
        host = self.host
        req = secureboost_pb2.TreeStart(header=host.header(host.current), sample_ids=ids)
        if self.private_key is not None:
            self.slots = gh_slots(self.public_key, len(rows))
            ca = self.public_key.encrypt(
                gh / float(1 << FRAC_BITS),
                FRAC_BITS,
                slots=self.slots,
                workers=he_settings(self.cfg).workers,
            )
            req.public_key = json.dumps(self.public_key.to_json()).encode()
            req.cipher.CopyFrom(cipher_to_proto(ca))
        else:
            req.plain.CopyFrom(tensors.to_proto(gh))
        futures = [r._call(START, req) for r in self.remotes]
        if self.own is not None:
            self.own.start_tree(rows, gh)
        for future in futures:
            future.result()

    def _gather(self, node_of: np.ndarray, nodes: list[int], k: int) -> list[np.ndarray]:
        futures = [(r, r.ask_histograms(node_of, nodes)) for r in self.remotes]
        own = [self.own.histograms(node_of, nodes)] if self.own is not None else []
        decoded = list(self.pool.map(lambda rf: rf[0].decode_histograms(rf[1], len(nodes), k), futures))
        return own + decoded

    def _train(self, cmd: messages_pb2.StepCommand, rows: np.ndarray) -> dict[str, float]:
        if self.params.ensemble == "boost" and len(rows) != len(self.train_rows):
            raise wrong_state(
                "boosting grows each tree over the whole training set: set train.batch_size >= the training set",
            )
        y = self.host.data.y[rows]
        gh = tree_gradients(self.ensemble, y, self.scores[rows])
        self._start_tree(np.asarray(cmd.sample_ids, dtype=np.int64), rows, gh)
        try:
            tree, leaf_of = grow_tree(
                self.parties,
                gh,
                self.ensemble.n_classes,
                self.params,
                lambda node_of, nodes: self._gather(node_of, nodes, gh.shape[1]),
            )
        except ValueError as exc:  # a split reply of the wrong size
            raise malformed(str(exc)) from exc
        self.ensemble.trees.append(tree)
        if self.own is not None:
            self.host.local.modules["bottom"].set(self.own.features, self.own.cuts)
        self.scores[rows] = self.ensemble.step_scores(tree, leaf_of, self.scores[rows])
        v = (  # training metrics: the new tree's own votes (forest), the running scores (boost)
            Ensemble(self.ensemble.n_classes, self.params, [tree]).confidence([leaf_of])
            if self.params.ensemble == "forest"
            else _softmax(self.scores[rows])
        )
        return _outcome(v, y)

    # -------------------------------------------------------------------- serving
    def _route(self, ids: np.ndarray, rows: np.ndarray, owner: int, split_ids: np.ndarray) -> np.ndarray:
        party = self.parties[owner]
        if party is self.own:
            return self.own.route(rows, split_ids)
        return party.route(ids, split_ids)

    def step(self, cmd: messages_pb2.StepCommand, rows: np.ndarray) -> dict[str, float]:
        start = time.perf_counter()
        phase = cmd.header.phase
        if phase == messages_pb2.TRAIN:
            out = self._train(cmd, rows)
        else:
            ids = np.asarray(cmd.sample_ids, dtype=np.int64)
            v = self.ensemble.predict(lambda owner, s: self._route(ids, rows, owner, s), len(rows))
            y = None if phase == messages_pb2.PREDICT else self.host.data.y[rows]
            v = self.keeper.keep(cmd, v, rows, self.model_view())
            out = _outcome(v, y)
        out["compute_s"] = time.perf_counter() - start
        return out

    def model_view(self) -> dict[str, Any]:
        """The label holder's own model, as its attacks may read it: the trees (splits as (party index,
        split id)), which party each index is, and its own split table."""
        return {
            "ensemble": self.ensemble,
            "owners": self.owner_names,
            "own_splits": (self.own.features, self.own.cuts) if self.own is not None else ([], []),
        }

    def state_dict(self) -> dict[str, Any]:
        """The trees, every row's running scores, its split table, the predictions kept and its key
        pair (the passive parties pinned its public key; the private key stays in its own file)."""
        return {
            "trees": self.ensemble.trees,
            "scores": self.scores,
            "own": (self.own.features, self.own.cuts) if self.own is not None else None,
            "predictions": self.keeper.parts,
            "keys": (self.public_key, self.private_key),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ensemble.trees = list(state["trees"])
        self.scores = np.asarray(state["scores"])
        if self.own is not None:
            self.own.features, self.own.cuts = (list(v) for v in state["own"])
        self.keeper.parts = state["predictions"]
        self.public_key, self.private_key = state["keys"]

    def checkpoint(self, path: Path) -> None:
        """Its split table (the host's modules) and the trees, <name>.trees.npz beside the checkpoint."""
        super().checkpoint(path)
        arrays = {
            f"tree{i:04d}_{k}": v for i, t in enumerate(self.ensemble.trees) for k, v in t.to_dict().items()
        }
        buf = io.BytesIO()
        np.savez(buf, owners=np.array(self.owner_names), **arrays)
        write_durable(path.with_suffix(".trees.npz"), buf.getvalue(), "the trees")

    def finish(self) -> None:
        self.keeper.write()
        self.pool.shutdown(wait=False)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _outcome(v: np.ndarray, y: np.ndarray | None) -> dict[str, float]:
    """The step's metrics: the cross-entropy of the confidence vectors (clipped) and the correct count."""
    n = len(v)
    if y is None:
        return {"loss_sum": 0.0, "correct": 0, "count": n}
    p = np.clip(v[np.arange(n), y], 1e-12, 1.0)
    return {"loss_sum": float(-np.log(p).sum()), "correct": int((v.argmax(1) == y).sum()), "count": n}


def _choice(*allowed: str) -> Param:
    return Param(
        allowed[0], "one of " + ", ".join(allowed), lambda v: v in allowed, " or ".join(map(repr, allowed))
    )


def _number(default: float, help_: str, lo: float, integer: bool = False) -> Param:
    def ok(v: Any) -> bool:
        kind = int if integer else (int, float)
        return isinstance(v, kind) and not isinstance(v, bool) and v >= lo

    return Param(default, help_, ok, f"{'an integer' if integer else 'a number'} >= {lo}")


@PROTOCOLS.register
class SecureBoost(Protocol):
    name = "secureboost"
    settings = frozenset({"aggregation"})  # aggregation must be "sum" (check_config)
    train_reads = TRAIN_KEYS - {"optimizer", "lr_schedule"}  # trees: no optimizer, no LR schedule
    description = "SecureBoost-style vertical trees: Paillier-packed (g, h) to every party, bucketed histograms back, splits kept by their owners"
    params = {
        # gh travel at the fixed precision FRAC_BITS (no frac_bits); the key only in the HE mode
        "key_bits": replace(HE_PARAMS["key_bits"], when=read_when("mode", "he")),
        "allow_insecure_keys": replace(HE_PARAMS["allow_insecure_keys"], when=read_when("mode", "he")),
        "workers": HE_PARAMS["workers"],
        "mode": Param(
            "he",
            "`he`: Paillier gh and histograms; `plain`: the same in plaintext",
            lambda v: v in ("he", "plain"),
            "'he' or 'plain'",
        ),
        "ensemble": Param(
            "forest",
            "`forest`: vote shares of the trees (one tree: a decision tree); `boost`: softmax of the summed leaf values",
            lambda v: v in ("forest", "boost"),
            "'forest' or 'boost'",
        ),
        "max_depth": _number(5, "depth of every tree", 1, integer=True),
        "n_bins": _number(
            32, "buckets per feature (candidate thresholds: at most n_bins - 1)", 2, integer=True
        ),
        "reg_lambda": _number(0.0, "L2 regularisation of leaf values (the lambda of the gain)", 0.0),
        "min_child_weight": _number(1e-3, "least sum of hessians on each side of a split", 0.0),
        "learning_rate": replace(
            _number(0.3, "shrinkage of each tree's leaf values (boost)", 0.0),
            when=read_when("ensemble", "boost"),
        ),
    }
    coordinator = SecureBoostCoordinator
    active = SecureBoostActive
    passive = SecureBoostPassive
    defense_hooks = frozenset({"scores"})  # SecureBoostActive's PredictionsKeeper; no gradients, no bottom

    @classmethod
    def check_config(cls, cfg: Config) -> list[tuple[str, str]]:
        problems = []
        for p in cfg.feature_parties:
            if p.bottom is None or p.bottom.kind != "splits":
                problems.append(
                    (
                        "parties",
                        f"secureboost: party {p.name!r} needs bottom: {{kind: splits, out: <number of classes>}}",
                    )
                )
        if cfg.model.top.kind != "none" or cfg.protocol.aggregation != "sum":
            problems.append(
                (
                    "model.top.kind",
                    "secureboost has no top model: model.top.kind 'none', protocol.aggregation 'sum'",
                )
            )
        if cfg.protocol.params.get("mode", "he") == "he":
            problems += insecure_key_problem(cfg)
        return problems
