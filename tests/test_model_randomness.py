"""A model's own randomness (dropout masks, the small ResNet's random shift) comes from its own seeded
generator: the same draws whatever else draws in the process and in whichever thread order, kept by a
checkpoint, and so the same on the loopback bridge (every party in one process) as in the reference."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import base_config, max_difference_from_reference, write_config
from vflnet.config import LRScheduleConfig, ModelConfig, OptimizerConfig
from vflnet.models.local import LocalModel
from vflnet.models.zoo import SeededDropout, build_bottom
from vflnet.runner.local import run_local
from vflnet.runner.reference import train_reference
from vflnet.validation import config_from_dict

DROPOUT_MLP = ModelConfig(kind="mlp", hidden=[32, 32], out=8, dropout=0.5)
SHIFTED_RESNET = ModelConfig(kind="resnet-small", channels=[4, 8], out=8, shift=2)


def _build(cfg: ModelConfig, shape: tuple[int, ...], seed: int = 7) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_bottom(cfg, shape).train()


@pytest.mark.parametrize(("cfg", "shape"), [(DROPOUT_MLP, (16,)), (SHIFTED_RESNET, (1, 12, 6))])
def test_training_draws_do_not_depend_on_other_draws_in_the_process(cfg, shape):
    a, b = _build(cfg, shape), _build(cfg, shape)
    x = torch.rand(6, *shape)
    for i in range(3):
        torch.rand(100 + i)  # someone else in the process draws between the two models' steps
        out_a = a(x)
        torch.manual_seed(1000 + i)  # ... or reseeds the process's generator
        assert torch.equal(out_a, b(x))
    assert not torch.equal(a(x), a(x))  # it is random: successive training steps draw anew


def test_dropout_drops_at_its_rate_and_scales_what_it_keeps():
    drop = SeededDropout(0.25)
    out = drop(torch.ones(200, 100))
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.02
    assert torch.allclose(out[kept], torch.full_like(out[kept], 1 / 0.75))
    assert torch.equal(drop.eval()(torch.ones(3, 4)), torch.ones(3, 4))


def test_a_restored_model_continues_its_generators_where_the_checkpoint_left_them():
    def local() -> LocalModel:
        return LocalModel({"bottom": _build(DROPOUT_MLP, (16,))}, OptimizerConfig(), LRScheduleConfig())

    x = torch.rand(6, 16)
    first = local()
    first.modules["bottom"](x)
    state = first.state()
    assert list(state["generators"]) == ["bottom.2", "bottom.5"]  # the two dropout layers
    expected = first.modules["bottom"](x)
    resumed = local()
    resumed.load_state(state)
    assert torch.equal(resumed.modules["bottom"](x), expected)
    # a checkpoint without them (an older vflnet's) says so instead of continuing with other draws
    with pytest.raises(ValueError, match=r"bottom\.2's generator"):
        local().load_state({k: v for k, v in state.items() if k != "generators"})


@pytest.mark.e2e
def test_a_dropout_run_on_the_loopback_bridge_ends_where_the_reference_ends(tmp_path):
    """Every party's dropout runs in one process, in threads: with the process's generator the masks
    would depend on the thread order, and the run would end elsewhere than the reference."""
    data = base_config(n_passive=2)
    for party in data["parties"][2:]:
        party["bottom"]["dropout"] = 0.3
    data["model"]["top"]["dropout"] = 0.3
    data["train"].update(max_steps=8)
    data["transport"]["bridge"] = "loopback"
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    reference = train_reference(config_from_dict(data), evaluate=False)
    worst = max_difference_from_reference(tmp_path / "run", reference)
    assert worst <= 1e-5, f"max parameter difference {worst}"


def test_local_model_train_sets_every_part_even_where_one_was_switched_alone():
    """``LocalModel.train`` skips the walk when every part is in the mode already; a part switched
    on its own (dropout in evaluation mode inside a training model) must still be switched back."""
    bottom = build_bottom(DROPOUT_MLP, (16,))
    local = LocalModel({"bottom": bottom}, OptimizerConfig(), LRScheduleConfig())
    dropout = next(m for m in bottom.modules() if isinstance(m, SeededDropout))
    local.train(False)
    assert not any(m.training for m in bottom.modules())
    local.train(True)
    assert all(m.training for m in bottom.modules())
    dropout.eval()
    local.train(True)
    assert dropout.training
