"""Loading uploaded `.pt2` archives without running anything the upload carries.

`torch.export.load` is not safe for untrusted files: it unpickles some members with
`weights_only=False`, falls back to full pickle for sample inputs, and `dlopen`s AOTInductor
libraries it finds in the archive. So fxtune reads the archive itself: `tuner.loading.archive`
checks the zip directory against an allowlist and size caps, `tuner.loading.op_policy` checks the
graph's operators, raw weights become tensors straight from their bytes (checked against their
declared sizes and the program's own placeholders), the few pickled members go through the
restricted `weights_only=True` unpickler, and torch's deserializer is handed ready-made dicts so it
never unpickles anything. Nothing process-wide is patched, so loads are safe from any thread, next
to the user's own `torch.load` calls.
"""

from __future__ import annotations

import io
import json
import os
import re
import threading
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from tuner.contract.errors import ArtifactFormatError, LoaderUnavailableError, UnsafeArtifactError
from tuner.host import failures
from tuner.loading import diagnose
from tuner.loading.archive import ArchiveLimits, ProgramArchive, open_archive
from tuner.loading.op_policy import check_program_json
from tuner.loading.program_schema import sanitize_payload_config, sanitize_program

PROGRAM_JSON = "models/model.json"
WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
SAMPLE_INPUTS = "data/sample_inputs/model.pt"
_STRIDED_LAYOUT = 7  # torch._export.serde.schema.Layout.Strided
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_TORCH_VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,64}")  # what a program's torch_version may be
# torch's deserializer keeps the one in progress in a module global: one program at a time.
_DESERIALIZE = threading.Lock()


def _serde() -> Any:
    """torch's program deserializer (private); without it fxtune refuses to load at all."""
    try:
        from torch._export.serde import schema, serialize

        for name in ("deserialize", "SerializedArtifact", "deserialize_scalar_type"):
            getattr(serialize, name)
        getattr(schema, "ScalarType")  # noqa: B009 - probed so a rename fails closed here
    except (ImportError, AttributeError) as exc:
        raise LoaderUnavailableError(
            f"this torch ({torch.__version__}) lacks the program deserializer fxtune's safe loader "
            f"uses ({exc}); refusing to load rather than fall back to torch.export.load"
        ) from None
    return serialize


def _dtype(code: Any) -> torch.dtype:
    serialize = _serde()
    try:
        from torch._export.serde.schema import ScalarType

        return serialize.deserialize_scalar_type(ScalarType(int(code)))
    except (ValueError, KeyError, TypeError):
        raise ArtifactFormatError(f"unknown tensor dtype code {code!r}") from None


def _ints(items: Any, what: str) -> list[int]:
    try:
        values = [int(item["as_int"]) for item in items]
    except (KeyError, TypeError, ValueError):
        raise ArtifactFormatError(f"{what} must be plain integers") from None
    if any(v < 0 for v in values):
        raise ArtifactFormatError(f"{what} must not be negative")
    return values


def _unpickle(data: bytes, what: str) -> Any:
    """A `torch.save` blob through the restricted unpickler, after checking its own zip."""
    if os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0") not in ("", "0"):
        raise UnsafeArtifactError(
            f"refused to load {what}: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set, which would turn "
            "off the restricted unpickler"
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as inner:
            records = inner.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError):
        raise UnsafeArtifactError(f"refused to load {what}: not a torch.save zip") from None
    if any(r.compress_type != zipfile.ZIP_STORED for r in records) or sum(
        r.file_size for r in records
    ) > len(data):
        raise UnsafeArtifactError(f"refused to load {what}: its records claim more than it holds")
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # the restricted unpickler says why in its message
        failures.input_fault(exc, f"unpickling {what}")
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnsafeArtifactError(
            f"refused to load {what}: it needs more than plain tensors ({reason}). "
            "Re-export the model with torch.export.save from plain tensors."
        ) from None


class _PayloadReader:
    """Builds the tensors a weights or constants config names, sharing storage as saved."""

    def __init__(self, archive: ProgramArchive, folder: str, prefix: str) -> None:
        self.archive = archive
        self.folder = folder
        self.prefix = prefix
        self._flat: dict[str, torch.Tensor] = {}

    def _member(self, path_name: Any) -> str:
        if not isinstance(path_name, str) or not path_name.startswith(self.prefix):
            raise UnsafeArtifactError(f"refused payload path {path_name!r} in {self.folder}")
        rel = f"{self.folder}/{path_name}"
        if not self.archive.has(rel):
            raise ArtifactFormatError(f"archive member {rel} is missing")
        return rel

    def _flat_tensor(self, rel: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
        key = f"{rel}:{dtype}"
        if key not in self._flat:
            nbytes = self.archive.size(rel)
            item = torch.empty((), dtype=dtype).element_size()
            if nbytes == 0:
                if numel:
                    raise ArtifactFormatError(f"{rel} is empty but declares {numel} elements")
                self._flat[key] = torch.empty(0, dtype=dtype)
            elif nbytes % item:
                raise ArtifactFormatError(f"{rel}: {nbytes} bytes is not a whole number of {dtype}")
            else:
                data = bytearray(self.archive.read(rel))
                self._flat[key] = torch.frombuffer(data, dtype=dtype)
        return self._flat[key]

    def tensor(self, fqn: str, meta: dict[str, Any]) -> torch.Tensor:
        rel = self._member(meta.get("path_name"))
        if meta.get("use_pickle"):
            value = _unpickle(self.archive.read(rel), f"{fqn} ({rel})")
            if type(value) not in _PLAIN_TENSORS:
                raise UnsafeArtifactError(f"refused {fqn}: it unpickles to {type(value).__name__}")
            return value
        tm = meta.get("tensor_meta")
        if not isinstance(tm, dict) or tm.get("layout", _STRIDED_LAYOUT) != _STRIDED_LAYOUT:
            raise ArtifactFormatError(f"{fqn}: only dense strided tensors are read raw")
        dtype = _dtype(tm.get("dtype"))
        sizes = _ints(tm.get("sizes"), f"{fqn} sizes")
        strides = _ints(tm.get("strides"), f"{fqn} strides")
        offset = _ints([tm.get("storage_offset")], f"{fqn} storage offset")[0]
        if len(sizes) != len(strides):
            raise ArtifactFormatError(f"{fqn}: sizes and strides differ in length")
        span = sum((s - 1) * st for s, st in zip(sizes, strides, strict=True))
        extent = 0 if 0 in sizes else offset + 1 + span
        flat = self._flat_tensor(rel, dtype, extent)
        if extent > flat.numel():
            raise ArtifactFormatError(
                f"{fqn}: declares {extent} elements of {rel}, which holds {flat.numel()}"
            )
        numel = 1
        for size in sizes:
            numel *= size
        if numel > flat.numel():
            raise UnsafeArtifactError(
                f"refused {fqn}: it declares {numel} elements over the {flat.numel()} its bytes "
                "hold (zero or overlapping strides would make a huge tensor from a few bytes)"
            )
        value = torch.as_strided(flat, sizes, strides, offset)
        if meta.get("is_param"):
            return torch.nn.Parameter(value, requires_grad=bool(tm.get("requires_grad")))
        return value

    def all(self, config_rel: str) -> dict[str, torch.Tensor]:
        if not self.archive.has(config_rel):
            raise ArtifactFormatError(f"archive member {config_rel} is missing")
        raw = sanitize_payload_config(_json(self.archive, config_rel), config_rel)
        config = raw.get("config")
        if not isinstance(config, dict):
            raise ArtifactFormatError(f"{config_rel} holds no payload config")
        return {str(fqn): self.tensor(str(fqn), meta) for fqn, meta in config.items()}


def _json(archive: ProgramArchive, rel: str) -> Any:
    try:
        return json.loads(archive.read_text(rel, archive.limits.max_json_bytes))
    except (ValueError, RecursionError) as exc:
        raise ArtifactFormatError(f"{rel} is not valid JSON: {exc}") from None


def _exported_with(program: dict[str, Any]) -> str | None:
    """The torch release that exported the program, where it says so in a plain version string
    (torch 2.4 and older wrote none)."""
    if "torch_version" not in program:
        return diagnose.TORCH_OLD_DEFAULT
    version = program["torch_version"]
    return version if isinstance(version, str) and _TORCH_VERSION.fullmatch(version) else None


def _check_schema_major(program: dict[str, Any], exported: str | None) -> None:
    """torch reads only programs of its own schema major version (as its deserializer would
    refuse later, with neither torch version named)."""
    from torch._export.serde import schema

    readable = getattr(schema, "SCHEMA_VERSION", None)
    if not isinstance(readable, tuple):
        return  # the deserializer's own check stands
    ours = readable[0]
    theirs = program.get("schema_version")
    major = theirs.get("major") if isinstance(theirs, dict) else None
    minor = theirs.get("minor") if isinstance(theirs, dict) else None
    if type(major) is int and type(minor) is int and major != ours and (major, minor) != (0, 0):
        raise diagnose.other_torch(
            exported, f"its export schema is version {major}.{minor}; this torch reads {ours}.x"
        )


def _program_json(archive: ProgramArchive) -> tuple[bytes, dict[str, Any], str | None]:
    """The program JSON as fxtune re-serializes it after the schema check: torch's deserializer
    only ever sees these bytes, never the upload's. Also the torch release it names."""
    raw = archive.read(PROGRAM_JSON, archive.limits.max_json_bytes)
    try:
        program = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ArtifactFormatError(f"{PROGRAM_JSON} is not valid JSON: {exc}") from None
    if not isinstance(program, dict) or "graph_module" not in program:
        raise ArtifactFormatError(f"{PROGRAM_JSON} is not a serialized exported program")
    exported = _exported_with(program)
    _check_schema_major(program, exported)
    try:
        program = sanitize_program(program)
    except RecursionError:
        raise UnsafeArtifactError(f"refused {PROGRAM_JSON}: nested too deeply") from None
    except (ArtifactFormatError, UnsafeArtifactError) as exc:
        raise diagnose.with_torch_hint(exc, exported) from None
    return json.dumps(program).encode(), program, exported


def _checked(
    path: Path | str, limits: ArchiveLimits | None
) -> tuple[ProgramArchive, bytes, str | None]:
    path = Path(path)
    if not path.is_file():
        raise diagnose.missing_file(path)
    archive = open_archive(path, limits)
    raw, program, exported = _program_json(archive)
    try:
        check_program_json(program)
    except (ArtifactFormatError, UnsafeArtifactError) as exc:
        raise diagnose.with_torch_hint(exc, exported) from None
    version = archive.read_text("archive_version", 64) if archive.has("archive_version") else "0"
    if version.strip() != "0":
        raise ArtifactFormatError(f"unsupported .pt2 archive version {version.strip()!r}")
    return archive, raw, exported


def check_archive(path: Path | str, limits: ArchiveLimits | None = None) -> ProgramArchive:
    """The cheap check an upload gets: zip directory, member allowlist, caps, graph operators.

    Reads only the directory and the program JSON, so a service can run it on every upload.
    """
    return _checked(path, limits)[0]


def _check_weights(program: ExportedProgram) -> None:
    """Every parameter, buffer and constant matches the shape and dtype its placeholder expects."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    tables = {
        InputKind.PARAMETER: program.state_dict,
        InputKind.BUFFER: {**program.state_dict, **program.constants},
        InputKind.CONSTANT_TENSOR: program.constants,
    }
    for spec in program.graph_signature.input_specs:
        table = tables.get(spec.kind)
        if table is None or spec.target is None:
            continue
        value = table.get(spec.target)
        expected = placeholders[spec.arg.name].meta.get("val")
        if not isinstance(value, torch.Tensor) or not isinstance(expected, torch.Tensor):
            raise ArtifactFormatError(f"{spec.target}: no tensor was saved for it")
        if value.dtype != expected.dtype or tuple(value.shape) != tuple(expected.shape):
            raise ArtifactFormatError(
                f"{spec.target}: saved as {value.dtype}{list(value.shape)}, but the graph expects "
                f"{expected.dtype}{list(expected.shape)}"
            )


def load_program(path: Path | str, limits: ArchiveLimits | None = None) -> ExportedProgram:
    """Load a `.pt2` written by `torch.export.save`, refusing anything that could run code."""
    archive, raw_program, exported = _checked(path, limits)
    serialize = _serde()
    with archive.kept_open():
        state_dict = _PayloadReader(archive, "data/weights", "weight_").all(WEIGHTS_CONFIG)
        constants = (
            _PayloadReader(archive, "data/constants", "tensor_").all(CONSTANTS_CONFIG)
            if archive.has(CONSTANTS_CONFIG)
            else {}
        )
        inputs = None
        if archive.has(SAMPLE_INPUTS):
            inputs = _unpickle(archive.read(SAMPLE_INPUTS), "the sample inputs")
    if inputs is not None and not (isinstance(inputs, tuple) and len(inputs) == 2):
        raise ArtifactFormatError("the sample inputs are not an (args, kwargs) pair")
    artifact = serialize.SerializedArtifact(raw_program, state_dict, constants, inputs)
    try:
        with _DESERIALIZE:
            program = serialize.deserialize(artifact)
    except (UnsafeArtifactError, ArtifactFormatError):
        raise
    except Exception as exc:  # torch's deserializer, not written for hostile input, says why
        failures.input_fault(exc, "deserializing the program")
        raise diagnose.with_torch_hint(
            ArtifactFormatError(f"could not load {Path(path).name}: {exc}"), exported
        ) from exc
    if not isinstance(program, ExportedProgram):
        raise ArtifactFormatError(f"{Path(path).name} holds no ExportedProgram")
    _check_weights(program)
    return program
