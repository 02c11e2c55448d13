"""The docs site's generated pages (docs/hooks/generate.py) follow the code: every setting and
every route is on them. `make docs` builds the whole site with --strict."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "generate.py"


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_setting_is_in_its_table_with_a_description(hook: ModuleType) -> None:
    for model in hook._settings_models().values():
        table = hook.settings_table(model)
        for name in model.model_fields:
            (row,) = [r for r in table.splitlines() if f"`FXTUNE_{name.upper()}`" in r]
            cells = re.split(r"(?<!\\)\|", row.strip().strip("|"))
            assert len(cells) == 5 and cells[-1].strip(), f"{name} has no description: {row}"
        assert str(Path.home()) not in table  # the same page whoever builds it


def test_the_api_page_has_every_route_of_the_app(hook: ModuleType) -> None:
    spec = hook.openapi_spec()
    page = hook.api_markdown(spec)
    for path, item in spec["paths"].items():
        for method in item:
            assert f"### `{method.upper()} {path}`" in page
    for name in spec["components"]["schemas"]:
        assert f"### {name}\n" in page
