"""Inductor's settings by name: what each holds, and that a package is built with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
import torch

from tuner.backends import inductor_settings
from tuner.backends import registry as backends
from tuner.contract.config import Figures, InductorSettings, Verdict


def test_every_setting_has_a_name_the_config_accepts_and_this_torch_has_them_all() -> None:
    names = {n for named in inductor_settings.SETTINGS.values() for n in named}
    assert names == set(get_args(InductorSettings))
    assert inductor_settings.available("cpu") == ["max-autotune", "freezing", "concat-linear"]
    assert inductor_settings.available("cuda") == []


def test_a_setting_missing_from_this_inductor_is_not_offered(monkeypatch: Any) -> None:
    monkeypatch.setitem(
        inductor_settings.SETTINGS["cpu"], "freezing", {"no_such_knob_in_inductor": True}
    )
    assert "freezing" not in inductor_settings.available("cpu")


def test_values_come_only_from_the_registry() -> None:
    assert inductor_settings.values_of(None, "cpu") == {}
    assert inductor_settings.values_of("freezing", "cpu") == {"freezing": True}
    with pytest.raises(ValueError, match="no inductor setting"):
        inductor_settings.values_of("max_autotune=True", "cpu")
    with pytest.raises(ValueError):  # a config names a setting from the list, nothing else
        Figures(name="x", backend="inductor", passes=[], verdict=Verdict.FASTER, settings="other")


def test_the_package_is_compiled_with_the_settings_values(monkeypatch: Any, tmp_path: Path) -> None:
    """What reaches AOTInductor is the registry's values for the name (the compile itself is
    inductor's; the suite's compile tests build real packages)."""
    seen: list[dict[str, Any]] = []

    def fake(program: Any, package_path: str, inductor_configs: dict[str, Any]) -> str:
        seen.append(inductor_configs)
        return package_path

    from tuner.host.torch_compat import inductor

    monkeypatch.setattr(inductor, "aoti_compile_and_package", fake)
    program = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    backends.package_aoti(program, tmp_path / "a.pt2")
    backends.package_aoti(program, tmp_path / "b.pt2", settings="max-autotune")
    assert seen == [{}, inductor_settings.SETTINGS["cpu"]["max-autotune"]]
    with pytest.raises(ValueError, match="for backend 'eager'"):
        backends.build(
            "eager", torch.fx.symbolic_trace(torch.nn.ReLU()), (), tmp_path, settings="freezing"
        )


def test_torch_compile_in_a_deployment_gets_the_settings(monkeypatch: Any) -> None:
    got: list[Any] = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: got.append(kw) or m)
    module = torch.nn.ReLU()
    assert backends.deployed("inductor", module, "freezing", "cpu") is module
    assert backends.deployed("inductor", module) is module
    assert got == [{"options": {"freezing": True}}, {}]
