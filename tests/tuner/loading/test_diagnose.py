"""Files that are not torch.export programs get a message that says what they are and what to
do, decided from zip member names and leading bytes alone (tuner.loading.diagnose)."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.service.helpers import tiny_program
from tests.wrong_files import WRONG_FILES, exported_by_old_torch, with_program_json
from tuner.contract.errors import ArtifactFormatError, UnsafeArtifactError
from tuner.contract.exit_codes import ExitCode, exit_code_for
from tuner.loading import diagnose
from tuner.loading.load import check_archive, load_program


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("programs") / "tiny.pt2"
    tiny_program(path)
    return path


@pytest.mark.parametrize(("what", "make", "message"), WRONG_FILES, ids=[w[0] for w in WRONG_FILES])
def test_a_wrong_file_says_what_it_is_and_how_to_export(
    tmp_path: Path, what: str, make: Callable[[Path], Path], message: str
) -> None:
    with pytest.raises(ArtifactFormatError) as refused:
        check_archive(make(tmp_path))
    assert str(refused.value) == message
    assert "torch.export.export(" in message and "torch.export.save(" in message
    assert exit_code_for(refused.value) == ExitCode.USER_INPUT


def test_a_missing_file_or_a_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(ArtifactFormatError, match=r"^no such file: .*nope\.pt2 \(pass the"):
        load_program(tmp_path / "nope.pt2")
    with pytest.raises(ArtifactFormatError, match=r"is a folder, not a \.pt2 file"):
        load_program(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", diagnose.EMPTY),
        (b"\x00\x01binary\xff", diagnose.NOT_A_ZIP),
        ("caf\u00e9 ".encode() * 2000, diagnose.TEXT),  # cut mid-character at 4 KiB: still text
    ],
    ids=["empty", "binary", "long utf-8 text"],
)
def test_files_that_are_not_zips(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "x.pt2"
    path.write_bytes(content)
    with pytest.raises(ArtifactFormatError) as refused:
        check_archive(path)
    assert str(refused.value) == message


def test_a_legacy_torch_save_is_told_from_its_magic_number(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(ArtifactFormatError) as refused:
        check_archive(path)
    assert str(refused.value) == diagnose.TORCH_SAVE


def test_a_zip_named_like_a_checkpoint_is_not_unpickled(tmp_path: Path) -> None:
    """Names decide: a data.pkl that is not a pickle at all gets the checkpoint message."""
    path = tmp_path / "fake.pt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("fake/data.pkl", b"not a pickle")
    with pytest.raises(ArtifactFormatError) as refused:
        check_archive(path)
    assert str(refused.value) == diagnose.TORCH_SAVE
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(ArtifactFormatError) as refused:
        check_archive(path)
    assert str(refused.value) == diagnose.OTHER_ZIP


def test_a_program_from_another_export_schema_names_both_torches(
    tmp_path: Path, program: Path
) -> None:
    old = with_program_json(program, tmp_path / "old.pt2", exported_by_old_torch)
    with pytest.raises(ArtifactFormatError) as refused:
        check_archive(old)
    message = str(refused.value)
    assert message.startswith("this program was exported with torch 2.3.1, and fxtune runs torch")
    assert f"torch {torch.__version__}" in message and "schema is version 7.3" in message
    assert message.endswith(f"export it again under torch {torch.__version__}")


def test_a_refusal_of_a_program_from_another_torch_names_both_and_keeps_its_type(
    tmp_path: Path, program: Path
) -> None:
    def newer(p: dict) -> None:
        p["torch_version"] = "2.99.0"
        p["graph_module"]["a_field_of_a_later_torch"] = 1

    with pytest.raises(UnsafeArtifactError) as refused:
        check_archive(with_program_json(program, tmp_path / "new.pt2", newer))
    assert "unknown key 'a_field_of_a_later_torch'" in str(refused.value)
    assert "exported with torch 2.99.0, and fxtune runs torch" in str(refused.value)
    assert exit_code_for(refused.value) == ExitCode.REFUSED


def test_a_program_from_this_torch_gets_no_hint(tmp_path: Path, program: Path) -> None:
    def broken(p: dict) -> None:
        p["graph_module"]["unknown"] = 1

    with pytest.raises(UnsafeArtifactError) as refused:
        check_archive(with_program_json(program, tmp_path / "b.pt2", broken))
    assert "exported with torch" not in str(refused.value)
    check_archive(program)  # and the real one passes


def test_a_damaged_zip_is_called_damaged_not_a_wrong_file(tmp_path: Path, program: Path) -> None:
    cut = tmp_path / "cut.pt2"
    cut.write_bytes(program.read_bytes()[:300])  # the first member's start, nothing more
    with pytest.raises(ArtifactFormatError, match=r"damaged or truncated zip \(BadZipFile"):
        check_archive(cut)
