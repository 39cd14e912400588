"""The gateway's registry of adapters loaded on demand (gateway.registry): a folder of adapters,
looked up at each request, or a file of name=path lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshserve.gateway.registry import LoraRegistry


def test_a_folders_adapters_are_its_subfolders_with_a_peft_config(tmp_path: Path) -> None:
    (tmp_path / "faq").mkdir()
    (tmp_path / "faq" / "adapter_config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    registry = LoraRegistry(str(tmp_path))
    assert registry.path("faq") == str(tmp_path / "faq")
    assert registry.path("empty") is None  # no adapter in it
    assert registry.path("news") is None
    (tmp_path / "news").mkdir()
    (tmp_path / "news" / "adapter_config.json").write_text("{}")
    assert registry.path("news") == str(tmp_path / "news")  # dropped in: served without a restart
    for name in ("..", ".", "faq/..", "../faq", ""):
        assert registry.path(name) is None, name


def test_a_file_names_each_adapters_path(tmp_path: Path) -> None:
    listing = tmp_path / "adapters.txt"
    listing.write_text("# the support team's\nsupport = /adapters/support\n\nlegal=/adapters/legal  # v2\n")
    registry = LoraRegistry(str(listing))
    assert (registry.path("support"), registry.path("legal"), registry.path("faq")) == (
        "/adapters/support", "/adapters/legal", None)


@pytest.mark.parametrize(("text", "says"), [
    ("support\n", "line 1: expected name=path"),
    ("a=/x\na=/y\n", "line 2: the adapter 'a' is named twice"),
])
def test_a_bad_line_is_refused_naming_it(tmp_path: Path, text: str, says: str) -> None:
    listing = tmp_path / "adapters.txt"
    listing.write_text(text)
    with pytest.raises(ValueError, match=says):
        LoraRegistry(str(listing))


def test_a_registry_that_is_not_there_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a folder of adapters nor a file"):
        LoraRegistry(str(tmp_path / "nothing"))
