"""A party's own file (parties[].source) and alignment as a phase on the wire (alignment.method)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import base_config
from vflnet.config import ConfigError
from vflnet.data.sources import SourceError, load_source, split_dataset
from vflnet.roles.alignment import POINT, Blinder, PartyAlignment, hashed
from vflnet.v1 import messages_pb2
from vflnet.validation import config_from_dict


def _split(tmp_path: Path, overlap: float = 0.7) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """base_config over digits, split into one CSV per party; the config mapping that reads them."""
    data = base_config(n_passive=2)
    sections = split_dataset(config_from_dict(data), tmp_path / "split", overlap, seed=0)
    for party in data["parties"]:
        if party["name"] in sections:
            party.pop("features", None)
            party["source"] = sections[party["name"]]
    data["data"] = {"test_fraction": 0.2}
    return data, sections


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _load(data: dict[str, Any], party: str) -> Any:
    cfg = config_from_dict(data)
    return load_source(cfg, cfg.party(party))


def test_split_writes_shuffled_string_ids_with_the_overlap_and_labels_only_at_the_active_party(tmp_path):
    data, sections = _split(tmp_path)
    files = {n: Path(s["path"]).read_text().splitlines() for n, s in sections.items()}
    assert files["active"][0] == "id,label"
    assert all("label" not in files[n][0] for n in ("passive-1", "passive-2"))
    ids = {n: [line.split(",")[0] for line in lines[1:]] for n, lines in files.items()}
    assert all(i.startswith("s") for i in ids["active"])
    assert ids["active"] != sorted(ids["active"])  # rows shuffled
    common = set.intersection(*(set(v) for v in ids.values()))
    assert 0.6 < len(common) / 1797 < 0.8
    assert all(len(v) > len(common) for v in ids.values())  # each party holds more than the intersection
    views = {n: _load(data, n) for n in sections}
    assert views["active"].y is not None and views["active"].x is None and views["active"].n_classes == 10
    assert views["passive-1"].y is None and views["passive-1"].x.shape[1] == len(
        sections["passive-1"]["features"]
    )


@pytest.mark.parametrize(
    ("text", "party", "found"),
    [
        ("key,label\ns1,0\n", "active", "column 'id': no such column"),
        ("id,label\ns1,0\ns1,1\n", "active", "column 'id': duplicate ID 's1'"),
        (
            "id,a,label\ns1,0.5,1\n",
            "passive-1",
            "column 'label': a passive party's file holds no label column",
        ),
        ("id,a\ns1,x\n", "passive-1", "column 'a': non-numeric value 'x'"),
        ("id,a\ns1,nan\n", "passive-1", "column 'a': NaN in row 1"),
    ],
)
def test_bad_files_are_one_line_errors_naming_party_file_and_column(tmp_path, text, party, found):
    data = base_config(n_passive=1)
    data["data"] = {"test_fraction": 0.2}
    active, passive = data["parties"][1], data["parties"][2]
    passive.pop("features")
    active["source"] = {"path": _write(tmp_path / "a.csv", "id,label\ns1,0\n"), "label_column": "label"}
    passive["source"] = {"path": _write(tmp_path / "p.csv", "id,a\ns1,1\n"), "features": ["a"]}
    target = active if party == "active" else passive
    target["source"]["path"] = _write(tmp_path / "bad.csv", text)
    with pytest.raises(SourceError) as err:
        _load(data, party)
    message = str(err.value)
    assert f"party {party!r}" in message and "bad.csv" in message and found in message, message
    assert "\n" not in message


def test_every_party_with_data_names_its_file_or_none_does(tmp_path):
    data, _ = _split(tmp_path)
    mixed = copy.deepcopy(data)
    mixed["parties"][3]["source"] = None
    mixed["parties"][3]["features"] = {"region": [0, 8, 4, 8]}
    with pytest.raises(ConfigError, match=r"parties\[3\]\.source"):
        config_from_dict(mixed)
    passive_label = copy.deepcopy(data)
    passive_label["parties"][2]["source"]["label_column"] = "label"
    with pytest.raises(
        ConfigError, match=r"parties\[2\]\.source\.label_column.*only the active party holds labels"
    ):
        config_from_dict(passive_label)


def test_attacks_keyed_by_dataset_ids_are_refused_where_steps_carry_row_indices():
    data = base_config(n_passive=1)
    data["alignment"] = {"method": "psi"}
    data["attacks"] = [{"name": "norm-scoring", "party": "passive-1"}]
    with pytest.raises(ConfigError, match=r"attacks\[0\]\.name.*row indices"):
        config_from_dict(data)


def test_blinding_commutes_and_hides_the_ids():
    a, b = Blinder(), Blinder()
    keys = np.array(["alice@example.org", "bob@example.org"], dtype=object)
    ab = b.reblind(a.blind(keys))
    assert ab == a.reblind(b.blind(keys)) and len(ab) == 2 * POINT
    assert a.blind(keys) != b.blind(keys) and hashed(keys)[:POINT] not in a.blind(keys)


def _party(tmp_path: Path, method: str, keys: list[str]) -> PartyAlignment:
    data = base_config(n_passive=1)
    data["alignment"] = {"method": method}
    cfg = config_from_dict(data)
    from vflnet.data.partition import PartyData

    view = PartyData(
        ids=np.arange(len(keys)), x=np.arange(len(keys), dtype=np.float32)[:, None], y=None, n_classes=0
    )
    view.keys = np.array(sorted(keys), dtype=object)
    return PartyAlignment(cfg, "passive-1", view, tmp_path)


@pytest.mark.parametrize("method", ["plain", "hashed", "psi"])
def test_two_parties_align_to_the_same_rows_in_the_same_order(tmp_path, method):
    mine = _party(tmp_path / "a", method, ["d", "a", "c", "x"])
    theirs = _party(tmp_path / "b", method, ["c", "y", "a", "d", "z"])
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    offer = messages_pb2.AlignRequest(op=messages_pb2.ALIGN_OFFER)
    offers = [p.handle(offer) for p in (mine, theirs)]
    if method == "plain":
        values = [list(o.keys) for o in offers]
    else:
        items = [o.items for o in offers]
        if method == "psi":
            items = [
                theirs.handle(messages_pb2.AlignRequest(op=messages_pb2.ALIGN_REBLIND, items=items[0])).items,
                mine.handle(messages_pb2.AlignRequest(op=messages_pb2.ALIGN_REBLIND, items=items[1])).items,
            ]
        values = [[i[k : k + POINT] for k in range(0, len(i), POINT)] for i in items]
    common = set(values[0]) & set(values[1])
    assert len(common) == 3
    for p, v in zip((mine, theirs), values, strict=True):
        positions = [k for k, x in enumerate(v) if x in common]
        p.handle(messages_pb2.AlignRequest(op=messages_pb2.ALIGN_RESULT, positions=positions, n_common=3))
    assert list(mine.aligned.keys) == list(theirs.aligned.keys) == ["a", "c", "d"]
    assert list(mine.aligned.ids) == [0, 1, 2]
    again = messages_pb2.AlignRequest(op=messages_pb2.ALIGN_REBLIND, items=b"\1" * POINT)
    with pytest.raises(Exception, match="psi only" if method != "psi" else "re-blinds each once"):
        mine.handle(again)  # no blinding oracle: one set per other party
