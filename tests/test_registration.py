"""Plug-ins are checked when they register (vflnet/registration.py): each registry runs its kind's
check on every entry, so a declaration that cannot work is refused at import, naming the class and
the problem, and every built-in and test plug-in passes the same check."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tests.plugins
from tests.conftest import base_config
from vflnet import sdk
from vflnet.config import ConfigError
from vflnet.data.datasets import DatasetSource
from vflnet.defenses.base import Defense
from vflnet.models.zoo import ModelKind
from vflnet.registry import (
    ATTACKS,
    DATASETS,
    DEFENSES,
    MODELS,
    PROTOCOLS,
    RegistrationError,
    Registry,
    registration_problems,
)
from vflnet.sdk.handlers import handles
from vflnet.threat.attack import Attack, Tap
from vflnet.v1 import messages_pb2
from vflnet.validation import config_from_dict

REGISTRIES = (ATTACKS, DEFENSES, DATASETS, MODELS, PROTOCOLS)
EXCHANGE = "/vflnet.v1.Active/ExchangeEmbeddings"


@pytest.fixture
def isolated_registries(monkeypatch):
    """What a test registers (test plug-ins it imports) is gone after it, as if never imported: the
    other tests see the registries as they were."""
    imported = set(sys.modules)
    for registry in REGISTRIES:
        registry.names()
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    yield
    for name in set(sys.modules) - imported:  # the plug-in modules, not their generated messages
        if name.startswith("tests.plugins.") and name.count(".") == 2 and not name.endswith("_test"):
            del sys.modules[name]


def test_every_built_in_and_test_plugin_passes_its_kinds_check(isolated_registries):
    for module in pkgutil.iter_modules(tests.plugins.__path__):  # each registers what it brings
        if not module.ispkg:
            importlib.import_module(f"tests.plugins.{module.name}")
    for registry in REGISTRIES:
        assert registry.check, registry.kind  # every registry checks its entries
        assert registry.names(), registry.kind
        for name, entry in registry.all().items():
            assert registration_problems(registry.check, entry) == [], (registry.kind, name)
    assert {"pull", "split"} <= set(PROTOCOLS.names())
    assert {"snoop", "model-thief", "view-recorder"} <= set(ATTACKS.names())


# ------------------------------------------------------------------------------------------- attacks
def _attack(**declared: Any) -> type[Attack]:
    """A complete, valid attack class, with ``declared`` replacing (or, as None, removing) its class
    attributes and methods."""
    body: dict[str, Any] = {
        "name": "bad-attack",
        "description": "test: one registration mistake",
        "roles": frozenset({"passive"}),
        "taps": (Tap("ExchangeEmbeddings", "response", "client"),),
        "observe": lambda self, event: None,
        "output": lambda self: {},
    }
    body.update(declared)
    body["__module__"] = __name__
    return type("BadAttack", (Attack,), {k: v for k, v in body.items() if v is not None})


def _rewrite(self: Any, event: Any) -> None:
    return None


ATTACK_MISTAKES: dict[str, tuple[dict[str, Any], str]] = {
    "tap on a method no service declares": (
        {"taps": (Tap("ExchangeEmbedings", "response", "client"),)},
        "method 'ExchangeEmbedings' is none of",
    ),
    "rewrite on a method no service declares": (
        {"rewrites": (Tap("Exchange", "request", "client"),), "rewrite": _rewrite},
        "rewrites Tap(method='Exchange'",
    ),
    "unknown direction": ({"taps": (Tap("ExchangeEmbeddings", "reply", "client"),)}, "direction 'reply'"),
    "a side no party has": ({"taps": (Tap("ExchangeEmbeddings", "request", "proxy"),)}, "side 'proxy'"),
    "taps not declared": ({"taps": None}, "taps must be a tuple of Tap, got None"),
    "taps not Taps": ({"taps": ("ExchangeEmbeddings",)}, "taps must be a tuple of Tap"),
    "roles not declared": ({"roles": None}, "it declares no roles"),
    "an unknown role": ({"roles": frozenset({"server"})}, "roles names 'server', which is no role"),
    "no roles": ({"roles": frozenset()}, "roles is empty"),
    "unknown knowledge": ({"knowledge": ("labels",)}, "knowledge 'labels' is no known kind"),
    "rewrites without rewrite()": (
        {"rewrites": (Tap("ExchangeEmbeddings", "request", "client"),)},
        "declares rewrites but does not implement rewrite()",
    ),
    "rewrite() without rewrites": (
        {"rewrite": _rewrite},
        "implements rewrite() but does not declare rewrites",
    ),
    "own view without observe_own()": ({"wants_own_view": True}, "does not implement observe_own()"),
    "observe_predictions() without the knowledge": (
        {"observe_predictions": lambda self, view: None},
        "implements observe_predictions() but does not declare the 'predictions' knowledge",
    ),
    "an abstract method left": ({"output": None}, "abstract methods unimplemented: output"),
    "nothing to see": ({"taps": ()}, "it declares nothing to see"),
    "no description": ({"description": ""}, "one-line description"),
    "params not Params": ({"params": {"k": 3}}, "params must map names to vflnet.registry.Param"),
}


@pytest.mark.parametrize("mistake", sorted(ATTACK_MISTAKES))
def test_an_attack_with_a_mistake_is_refused_at_registration(mistake):
    declared, text = ATTACK_MISTAKES[mistake]
    with pytest.raises(RegistrationError) as info:
        ATTACKS.register(_attack(**declared))
    message = str(info.value)
    assert message.startswith(f"attack 'bad-attack' ({__name__}.BadAttack) cannot register: "), message
    assert text in message
    assert "bad-attack" not in ATTACKS.names()  # nothing refused is registered


def test_a_valid_attack_registers_and_the_check_knows_plugin_services(isolated_registries):
    """The same class without the mistake registers (into a registry of its own, to leave ATTACKS as it
    is); a tap on a plug-in service's method is valid once the service is registered."""
    own = Registry("attack", "vflnet.attacks", ATTACKS.check)
    assert own.register(_attack()).name == "bad-attack"
    importlib.import_module("tests.plugins.pull_protocol")  # registers vflnet_plugin_test.Pull
    pull = _attack(name="pull-tap", taps=(Tap("Forward", "response", "server"),))
    assert own.register(pull) is pull


def test_a_non_attack_is_refused():
    class NotAnAttack:
        name = "not-an-attack"

    with pytest.raises(RegistrationError, match=r"an attack is a subclass of vflnet\.threat\.attack\.Attack"):
        ATTACKS.register(NotAnAttack)


# ------------------------------------------------------------------------------------------ defenses
def _defense(**declared: Any) -> type[Defense]:
    body: dict[str, Any] = {
        "name": "bad-defense",
        "description": "test: one registration mistake",
        "roles": frozenset({"active"}),
        "acts_on": "scores",
        "implementation": staticmethod(lambda scores: scores),
        "build": lambda self, num_classes, seed: lambda scores: scores,
    }
    body.update(declared)
    body["__module__"] = __name__
    return type("BadDefense", (Defense,), {k: v for k, v in body.items() if v is not None})


DEFENSE_MISTAKES: dict[str, tuple[dict[str, Any], str]] = {
    "an unknown hook point": ({"acts_on": "score"}, "acts_on names 'score', which is no hook point"),
    "an unknown required hook point": (
        {"requires": frozenset({"plaintext"})},
        "requires names 'plaintext', which is no hook point",
    ),
    "no implementation": ({"implementation": None}, "it declares no implementation"),
    "an unknown role": ({"roles": frozenset({"activ"})}, "roles names 'activ', which is no role"),
    "build() left abstract": ({"build": None}, "abstract methods unimplemented: build"),
}


@pytest.mark.parametrize("mistake", sorted(DEFENSE_MISTAKES))
def test_a_defense_with_a_mistake_is_refused_at_registration(mistake):
    declared, text = DEFENSE_MISTAKES[mistake]
    with pytest.raises(RegistrationError) as info:
        DEFENSES.register(_defense(**declared))
    assert str(info.value).startswith(f"defense 'bad-defense' ({__name__}.BadDefense) cannot register: ")
    assert text in str(info.value)
    assert "bad-defense" not in DEFENSES.names()
    assert Registry("defense", "vflnet.defenses", DEFENSES.check).register(_defense())  # fixed: it registers


# ----------------------------------------------------------------------------------------- protocols
class _Passive(sdk.PartySide):
    def step(self, cmd: Any, rows: np.ndarray) -> dict[str, float]:
        return {}


def _protocol(active: dict[str, Any] | None = None, **declared: Any) -> type[sdk.Protocol]:
    """A valid protocol class whose active side has the methods ``active`` (a handler, a step) and whose
    class attributes ``declared`` replace the valid ones."""
    side = type("BadActive", (_Passive,), {"__module__": __name__, **(active or {})})
    body: dict[str, Any] = {
        "name": "bad-protocol",
        "description": "test: one registration mistake",
        "active": side,
        "passive": _Passive,
        "__module__": __name__,
    }
    body.update(declared)
    return type("BadProtocol", (sdk.Protocol,), body)


# handlers at module level, so that their annotations resolve as a plug-in's do
@handles(EXCHANGE, callers={"passive"})
def receive(self: Any, msg: messages_pb2.Embeddings, context: Any) -> messages_pb2.EmbeddingGradients:
    return messages_pb2.EmbeddingGradients()


@handles(EXCHANGE, callers={"passive"})
def receive_command(
    self: Any, msg: messages_pb2.StepCommand, context: Any
) -> messages_pb2.EmbeddingGradients:
    return messages_pb2.EmbeddingGradients()


@handles(EXCHANGE, callers={"passive"})
def receive_report(self: Any, msg: messages_pb2.Embeddings, context: Any) -> messages_pb2.StepReport:
    return messages_pb2.StepReport()


@handles("/vflnet.v1.Active/Exchange", callers={"passive"})
def receive_unknown(self: Any, msg: messages_pb2.Embeddings, context: Any) -> messages_pb2.EmbeddingGradients:
    return messages_pb2.EmbeddingGradients()


PROTOCOL_MISTAKES: dict[str, tuple[Callable[[], type[sdk.Protocol]], str]] = {
    "a handler for a method no service declares": (
        lambda: _protocol({"receive": receive_unknown}),
        "BadActive.receive handles /vflnet.v1.Active/Exchange, which no registered gRPC service declares",
    ),
    "a handler's request of another type": (
        lambda: _protocol({"receive": receive_command}),
        "BadActive.receive takes its request as StepCommand, but "
        "/vflnet.v1.Active/ExchangeEmbeddings's request is vflnet.v1.Embeddings",
    ),
    "a handler's reply of another type": (
        lambda: _protocol({"receive": receive_report}),
        "takes its reply as StepReport, but /vflnet.v1.Active/ExchangeEmbeddings's reply is "
        "vflnet.v1.EmbeddingGradients",
    ),
    "a handler that does not take (request, context)": (
        lambda: _protocol({"receive": handles(EXCHANGE, callers={"passive"})(lambda self, msg: None)}),
        "BadActive.receive must take (self, request, context)",
    ),
    "one method handled twice": (
        lambda: _protocol(
            {
                "receive": receive,
                "receive_again": receive,
            }
        ),
        "both handle /vflnet.v1.Active/ExchangeEmbeddings",
    ),
    "a handler of a method the host serves": (
        lambda: _protocol(
            {
                "run_step": handles("/vflnet.v1.Party/RunStep", callers={"coordinator"})(
                    lambda self, req, context: None
                )
            }
        ),
        "BadActive.run_step handles /vflnet.v1.Party/RunStep, which the host serves",
    ),
    "an unknown defense hook point": (
        lambda: _protocol(defense_hooks=frozenset({"labels", "gradients"})),
        "defense_hooks names 'gradients', which is no hook point",
    ),
    "a setting ProtocolConfig does not have": (
        lambda: _protocol(settings=frozenset({"aggregaton"})),
        "settings names 'aggregaton', which is no protocol setting",
    ),
    "knowledge no protocol delivers": (
        lambda: _protocol(provides=frozenset({"train_ids"})),
        "provides names 'train_ids', which is no protocol-delivered knowledge",
    ),
    "params that are not Params": (
        lambda: _protocol(params={"rounds": 3}),
        "params must map names to vflnet.registry.Param",
    ),
    "a side without step()": (
        lambda: _protocol(passive=sdk.PartySide),
        "passive side PartySide does not implement step()",
    ),
    "a side that is no side": (lambda: _protocol(coordinator=object), "coordinator must be a subclass of"),
}


@pytest.mark.parametrize("mistake", sorted(PROTOCOL_MISTAKES))
def test_a_protocol_with_a_mistake_is_refused_at_registration(mistake):
    make, text = PROTOCOL_MISTAKES[mistake]
    with pytest.raises(RegistrationError) as info:
        PROTOCOLS.register(make())
    assert str(info.value).startswith(f"protocol 'bad-protocol' ({__name__}.BadProtocol) cannot register: ")
    assert text in str(info.value)
    assert "bad-protocol" not in PROTOCOLS.names()


def test_the_valid_protocol_registers():
    good = _protocol({"receive": receive})
    assert Registry("protocol", "vflnet.protocols", PROTOCOLS.check).register(good) is good


# ----------------------------------------------------------------------------- datasets, model kinds
def test_datasets_and_model_kinds_are_checked():
    with pytest.raises(
        RegistrationError,
        match=r"dataset 'blank' \(DatasetSource from .*\) cannot register: "
        r"it needs a one-line description",
    ):
        DATASETS.register(DatasetSource("blank", "", lambda params: None))
    with pytest.raises(RegistrationError, match=r"params must map names to vflnet\.registry\.Param"):
        DATASETS.register(DatasetSource("blank", "a dataset", lambda params: None, {"n": 3}))  # type: ignore[dict-item]
    with pytest.raises(
        RegistrationError, match="it has neither build_bottom nor build_top, so it can sit nowhere"
    ):
        MODELS.register(ModelKind("nowhere", "a model kind"))
    with pytest.raises(RegistrationError, match="image_input applies to a bottom"):
        MODELS.register(
            ModelKind("top-image", "a model kind", build_top=lambda b, w, c: None, image_input=True)
        )
    assert "blank" not in DATASETS and "nowhere" not in MODELS


# ------------------------------------------------------------------------- through a config's plugins:
def test_a_refused_plugin_is_a_config_error_naming_the_module_class_and_problem(tmp_path, monkeypatch):
    (tmp_path / "bad_tap_plugin.py").write_text(
        "from vflnet.registry import ATTACKS\n"
        "from vflnet.threat.attack import Attack, Tap\n\n\n"
        "@ATTACKS.register\n"
        "class BadTap(Attack):\n"
        "    name = 'bad-tap'\n"
        "    description = 'taps a message that never flows'\n"
        "    roles = frozenset({'passive'})\n"
        "    taps = (Tap('ExchangeEmbedding', 'response', 'client'),)\n\n"
        "    def observe(self, event):\n        pass\n\n"
        "    def output(self):\n        return {}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = base_config()
    data["plugins"] = ["bad_tap_plugin"]
    try:
        with pytest.raises(ConfigError) as info:
            config_from_dict(data, "run.yaml")
    finally:
        sys.modules.pop("bad_tap_plugin", None)
    assert info.value.key == "plugins"
    assert "bad_tap_plugin: attack 'bad-tap' (bad_tap_plugin.BadTap) cannot register" in info.value.message
    assert "method 'ExchangeEmbedding' is none of" in info.value.message
