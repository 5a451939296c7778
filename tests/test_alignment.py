import numpy as np

from tests.conftest import base_config
from vflnet.data.alignment import epoch_batches, intersect, split_train_test
from vflnet.data.partition import party_view
from vflnet.validation import config_from_dict


def test_intersection_and_split_are_deterministic_and_disjoint():
    common = intersect([np.arange(0, 100), np.arange(10, 120), np.array([5, 10, 11, 50, 99, 200])])
    np.testing.assert_array_equal(common, [10, 11, 50, 99])
    ids = np.arange(1000)
    tr, te = split_train_test(ids, 0.2, seed=1)
    assert len(te) == 200 and len(np.intersect1d(tr, te)) == 0 and len(tr) + len(te) == 1000
    tr2, te2 = split_train_test(ids, 0.2, seed=1)
    np.testing.assert_array_equal(te, te2)
    assert not np.array_equal(te, split_train_test(ids, 0.2, seed=2)[1])


def test_epoch_batches_cover_each_id_once_and_change_per_epoch():
    ids = np.arange(130)
    b0 = epoch_batches(ids, 32, epoch=0, seed=0, drop_last=False)
    assert [len(b) for b in b0] == [32, 32, 32, 32, 2]
    np.testing.assert_array_equal(np.sort(np.concatenate(b0)), ids)
    assert not np.array_equal(b0[0], epoch_batches(ids, 32, epoch=1, seed=0, drop_last=False)[0])
    assert len(epoch_batches(ids, 32, epoch=0, seed=0, drop_last=True)) == 4


def test_party_views_hold_only_their_columns_and_only_active_holds_labels():
    data = base_config(n_passive=2)
    data["parties"][3]["sample_fraction"] = 0.5
    cfg = config_from_dict(data)
    active, p1, p2 = (party_view(cfg, n) for n in ("active", "passive-1", "passive-2"))
    assert active.x is None and active.y is not None
    assert p1.y is None and p1.x.shape == (1797, 32)
    assert len(p2.ids) == round(1797 * 0.5)
    assert len(intersect([active.ids, p1.ids, p2.ids])) == len(p2.ids)
