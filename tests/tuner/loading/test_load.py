"""The loader never runs code from an upload: crafted archives are refused, real ones load.

Each hostile file has a control showing that plain `torch.export.load` does the harm, so the
refusal tests can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.export import Dim

from tests.crafted import MARKER_ENV
from tuner.contract.errors import ArtifactFormatError, LoaderUnavailableError, UnsafeArtifactError
from tuner.graph.capture import example_inputs, export_module, save_program
from tuner.loading.load import check_archive, load_program

REFUSALS = {
    "planted_library": (UnsafeArtifactError, "AOTInductor members carry native libraries"),
    "zip_bomb": (UnsafeArtifactError, "zip bomb"),
    "from_file": (UnsafeArtifactError, r"aten\.from_file.*host"),
    "custom_op": (UnsafeArtifactError, r"evil\.linear.*custom or unknown"),
    "traversal": (UnsafeArtifactError, "member name"),
    "absolute_name": (UnsafeArtifactError, "member name"),
    "many_members": (UnsafeArtifactError, "members"),
    "pickled_inputs": (UnsafeArtifactError, "sample inputs"),
    "resized_weight": (ArtifactFormatError, "graph expects"),
    "overlong_weight": (ArtifactFormatError, "which holds"),
}
CHECKED_AT_UPLOAD = {"planted_library", "zip_bomb", "from_file", "custom_op", "traversal"}


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def program_file(tmp_path: Path) -> Path:
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    return save_program(export_module(net, (torch.randn(2, 4),)), tmp_path / "ok.pt2")


def test_real_program_loads_with_inputs(program_file: Path) -> None:
    program = load_program(program_file)
    (x,) = example_inputs(program)
    assert x.shape == (2, 4)
    assert program.module()(x).shape == (2, 3)


class Shared(nn.Module):
    """Tied weights, a buffer, a non-persistent buffer, a lifted constant and a dynamic batch."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.b.weight = self.a.weight
        self.register_buffer("scale", torch.full((8,), 2.0))
        self.register_buffer("shift", torch.arange(8.0), persistent=False)
        self.const = torch.linspace(0, 1, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) * self.scale + self.shift + self.const


def test_loads_what_torch_export_load_loads(tmp_path: Path) -> None:
    program = torch.export.export(
        Shared(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch", min=2, max=512)},)
    )
    path = save_program(program, tmp_path / "shared.pt2")
    ours, theirs = load_program(path), torch.export.load(path)
    assert {str(v) for v in ours.range_constraints.values()} == {"VR[2, 512]"}
    assert ours.state_dict.keys() == theirs.state_dict.keys()
    for name, value in theirs.state_dict.items():
        assert torch.equal(ours.state_dict[name], value), name
    assert ours.state_dict["a.weight"].data_ptr() == ours.state_dict["b.weight"].data_ptr()
    for batch in (2, 7, 512):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(ours.module()(x), theirs.module()(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_hostile_file_is_refused(hostile: dict[str, Path], name: str) -> None:
    error, match = REFUSALS[name]
    with pytest.raises(error, match=match):
        load_program(hostile[name])


@pytest.mark.parametrize("name", sorted(CHECKED_AT_UPLOAD))
def test_upload_check_refuses_without_loading(hostile: dict[str, Path], name: str) -> None:
    error, match = REFUSALS[name]
    with pytest.raises(error, match=match):
        check_archive(hostile[name])


@pytest.mark.slow
def test_controls_plain_torch_does_the_harm(hostile: dict[str, Path], tmp_path: Path) -> None:
    """Plain torch.export.load runs the planted library and the pickle; the graph reads the host.

    One child for the three (each harm leaves its own evidence): a Python importing torch and
    torch.export's loader costs about 5 s of CPU."""
    marker = tmp_path / "library-ran"
    pickled = hostile["pickled_inputs"]
    out = run_python(
        "import torch\n"
        f"try: torch.export.load({str(hostile['planted_library'])!r})\n"
        "except Exception: pass\n"
        f"try: torch.export.load({str(pickled)!r})\n"
        "except Exception: pass\n"
        f"m = torch.export.load({str(hostile['from_file'])!r}).module()\n"
        "print(bytes(m(torch.zeros(16, dtype=torch.uint8)).tolist()).decode())",
        {MARKER_ENV: str(marker)},
    )
    assert marker.read_text() == "pwned"

    assert (pickled.parent / "pickle-ran").exists()
    (pickled.parent / "pickle-ran").unlink()

    assert out.stdout.strip() == "SECRET-HOST-FILE", out.stderr[-2000:]


def test_refusals_use_little_memory_and_leave_nothing(
    hostile: dict[str, Path], tmp_path: Path
) -> None:
    """In a fresh process: every file refused, no marker, nothing in TMPDIR, peak RSS < 1 GiB.

    The peak is the process's VmHWM: getrusage's ru_maxrss survives exec, so it reported the
    (large) pytest parent's peak on CI.
    """
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    marker = tmp_path / "marker"
    files = {name: str(hostile[name]) for name in REFUSALS}
    code = (
        "import json, sys\n"
        "from tuner.loading.load import load_program\n"
        "from tuner.contract.errors import FxtuneError\n"
        f"files = {files!r}\n"
        "out = {}\n"
        "for name, path in files.items():\n"
        "    try:\n"
        "        load_program(path)\n"
        "        out[name] = 'loaded'\n"
        "    except FxtuneError as exc:\n"
        "        out[name] = type(exc).__name__\n"
        "status = open('/proc/self/status').read()\n"
        "out['peak_kib'] = int(status.split('VmHWM:')[1].split()[0])\n"
        "print(json.dumps(out))\n"
    )
    done = run_python(code, {MARKER_ENV: str(marker), "TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    peak_kib = result.pop("peak_kib")
    assert result == {name: err.__name__ for name, (err, _) in REFUSALS.items()}
    assert peak_kib < 1024 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"
    assert not marker.exists()
    assert list(scratch.iterdir()) == []
    assert not (hostile["pickled_inputs"].parent / "pickle-ran").exists()


def test_not_a_zip(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"definitely not a zip")
    with pytest.raises(ArtifactFormatError, match=r"text file, not a torch\.export program"):
        load_program(junk)


def test_zip_without_program(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pt2"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("hello.txt", "hi")
    with pytest.raises(ArtifactFormatError, match="archive_format"):
        check_archive(empty)


def test_forced_full_pickle_is_refused(
    hostile: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD would turn the restricted unpickler off: refuse instead."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(UnsafeArtifactError, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        load_program(hostile["good"])


def test_missing_deserializer_fails_closed(
    hostile: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._export.serde import serialize

    monkeypatch.delattr(serialize, "SerializedArtifact")
    with pytest.raises(LoaderUnavailableError, match="refusing to load"):
        load_program(hostile["good"])


class Trusted:
    """A class only full pickle can rebuild: the user's own trusted checkpoint."""

    def __init__(self, value: int) -> None:
        self.value = value


def test_concurrent_loads_leave_torch_load_alone(hostile: dict[str, Path], tmp_path: Path) -> None:
    """8 threads load uploads while the host program keeps using full torch.load on its files."""
    trusted = tmp_path / "trusted.pt"
    torch.save(Trusted(7), trusted)
    failures: list[BaseException] = []
    stop = threading.Event()

    def user_loads() -> None:
        while not stop.is_set():
            try:
                assert torch.load(trusted, weights_only=False).value == 7
            except BaseException as exc:
                failures.append(exc)
                return

    def fxtune_loads() -> None:
        try:
            for _ in range(3):
                load_program(hostile["good"])
                with pytest.raises(UnsafeArtifactError):
                    load_program(hostile["pickled_inputs"])
        except BaseException as exc:
            failures.append(exc)

    user = threading.Thread(target=user_loads)
    user.start()
    loaders = [threading.Thread(target=fxtune_loads) for _ in range(8)]
    for t in loaders:
        t.start()
    for t in loaders:
        t.join()
    stop.set()
    user.join()
    assert failures == []
    assert torch.load is torch.serialization.load


def test_a_program_with_many_tensors_reads_its_zip_directory_a_few_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened once per tensor, zipfile parsed the whole central directory each time
    (efficientnet_b0's 360 tensors: 0.6 s of a 2.5 s load); the reads now share one open zip."""
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(40)]).eval()
    path = save_program(export_module(model, (torch.randn(2, 4),)), tmp_path / "many.pt2")
    opened: list[object] = []

    class Counted(zipfile.ZipFile):
        def __init__(self, *args: object, **kwargs: object) -> None:
            opened.append(args[0])
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(zipfile, "ZipFile", Counted)
    program = load_program(path)
    assert len(program.state_dict) == 80
    assert len(opened) <= 10, f"the zip was opened {len(opened)} times"  # 88 before
    x = torch.randn(2, 4)
    torch.testing.assert_close(program.module()(x), model(x))
