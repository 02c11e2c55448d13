"""The loader never runs code from an upload: crafted archives are refused, real ones load."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from tuner.capture import example_inputs, export_module, save_program
from tuner.errors import ArtifactFormatError, UnsafeArtifactError
from tuner.load import check_archive, load_program


class Payload:
    """Unpickling this writes a marker file: stands in for an attacker's code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        code = f"open({str(self.marker)!r}, 'w').write('pwned')"
        return (exec, (code,))


@pytest.fixture
def program_file(tmp_path: Path) -> Path:
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    return save_program(export_module(net, (torch.randn(2, 4),)), tmp_path / "ok.pt2")


def replace_member(src: Path, dst: Path, suffix: str, data: bytes) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        hit = False
        for item in zin.infolist():
            if item.filename.endswith(suffix):
                zout.writestr(item, data)
                hit = True
            else:
                zout.writestr(item, zin.read(item))
    assert hit, f"no member ends with {suffix}"


def malicious_archive(program_file: Path, tmp_path: Path, marker: Path) -> Path:
    buf = io.BytesIO()
    torch.save((Payload(marker),), buf)
    bad = tmp_path / "bad.pt2"
    replace_member(program_file, bad, "data/sample_inputs/model.pt", buf.getvalue())
    return bad


def test_real_program_loads_with_inputs(program_file: Path) -> None:
    program = load_program(program_file)
    (x,) = example_inputs(program)
    assert x.shape == (2, 4)
    assert program.module()(x).shape == (2, 3)


def test_plain_torch_load_runs_the_payload(program_file: Path, tmp_path: Path) -> None:
    """Control: the crafted archive really is dangerous under plain torch.export.load."""
    marker = tmp_path / "plain-marker"
    bad = malicious_archive(program_file, tmp_path, marker)
    subprocess.run(
        [sys.executable, "-c", f"import torch; torch.export.load({str(bad)!r})"],
        capture_output=True,
        timeout=120,
    )
    assert marker.exists()


def test_crafted_archive_is_refused_and_payload_never_runs(
    program_file: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    bad = malicious_archive(program_file, tmp_path, marker)
    with pytest.raises(UnsafeArtifactError, match="refused"):
        load_program(bad)
    assert not marker.exists()
    # torch.load is restored afterwards: the process keeps working normally.
    assert load_program(program_file) is not None


def test_not_a_zip(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"definitely not a zip")
    with pytest.raises(ArtifactFormatError, match=r"not a \.pt2"):
        load_program(junk)


def test_zip_without_program(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pt2"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("hello.txt", "hi")
    with pytest.raises(ArtifactFormatError, match="archive_format"):
        check_archive(empty)
