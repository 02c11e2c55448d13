"""Streaming multipart reader: files go straight to spool files under a hard size cap.

FastAPI's `UploadFile` buffers the whole body before the endpoint runs, so the cap could only be
checked afterwards. Here every chunk is counted as it arrives, also for chunked uploads that
send no Content-Length, and a refused upload leaves no file behind.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from fastapi import HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from python_multipart.exceptions import ParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool

from service.artifacts import ArtifactStore, Spool, TooLarge

MAX_FIELD_BYTES = 64 * 1024
MAX_PARTS = 16
# After refusing an oversize body we read (and drop) a little more of it, so that ordinary
# clients get to see the 413 instead of a reset connection.
DRAIN_BYTES = 32 * 1024 * 1024
DRAIN_S = 5.0


@dataclass
class StreamedForm:
    fields: dict[str, str] = field(default_factory=dict)
    files: dict[str, Spool] = field(default_factory=dict)

    def discard(self) -> None:
        for spool in self.files.values():
            spool.discard()


class _Collector:
    """python-multipart callbacks that route each part to a spool or a small text buffer."""

    def __init__(
        self, artifacts: ArtifactStore, file_fields: frozenset[str], max_file_bytes: int
    ) -> None:
        self.form = StreamedForm()
        self._artifacts = artifacts
        self._file_fields = file_fields
        self._max_file_bytes = max_file_bytes
        self._headers: dict[bytes, bytes] = {}
        self._header_field = b""
        self._header_value = b""
        self._text: bytearray | None = None
        self._spool: Spool | None = None
        self._name = ""
        self._parts = 0
        self.ended = False

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field_data,
            "on_header_value": self._header_value_data,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        }

    def _part_begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise _BadForm(f"more than {MAX_PARTS} form fields")
        self._headers = {}

    def _header_field_data(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header_field.strip().lower()] = self._header_value.strip()
        self._header_field = self._header_value = b""

    def _headers_finished(self) -> None:
        _, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = params.get(b"name", b"").decode("utf-8", "replace")
        if not name:
            raise _BadForm("a form part has no name")
        if name in self.form.fields or name in self.form.files:
            raise _BadForm(f"form field {name!r} given twice")
        self._name = name
        if name in self._file_fields:
            raw = params.get(b"filename")
            filename = raw.decode("utf-8", "replace") if raw is not None else None
            self._spool = self._artifacts.spool(self._max_file_bytes, filename)
            self.form.files[name] = self._spool
        else:
            self._text = bytearray()

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._spool is not None:
            self._spool.write(data[start:end])
        elif self._text is not None:
            self._text += data[start:end]
            if len(self._text) > MAX_FIELD_BYTES:
                raise _BadForm(f"form field {self._name!r} is longer than {MAX_FIELD_BYTES} bytes")

    def _part_end(self) -> None:
        if self._spool is not None:
            self._spool.close()
        elif self._text is not None:
            self.form.fields[self._name] = self._text.decode("utf-8", "replace")
        self._spool = None
        self._text = None

    def _end(self) -> None:
        self.ended = True


class _BadForm(Exception):
    pass


def too_large(limit: int) -> HTTPException:
    mb = limit / (1024 * 1024)
    return HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE, f"upload larger than the limit of {mb:g} MB"
    )


async def read_form(
    request: Request,
    artifacts: ArtifactStore,
    *,
    file_fields: frozenset[str],
    max_file_bytes: int,
    max_body_bytes: int,
) -> StreamedForm:
    """Read a multipart/form-data body; raises 413 / 415 / 400 and then nothing is kept."""
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data":
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "expected a multipart/form-data body"
        )
    boundary = params.get(b"boundary")
    if not boundary:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "multipart body without a boundary")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise too_large(max_file_bytes)

    collector = _Collector(artifacts, file_fields, max_file_bytes)
    parser = MultipartParser(boundary, collector.callbacks())  # type: ignore[arg-type]
    received = 0
    stream = request.stream()
    try:
        async for chunk in stream:
            received += len(chunk)
            if received > max_body_bytes:
                raise TooLarge
            if chunk:
                await run_in_threadpool(parser.write, chunk)
        parser.finalize()
    except TooLarge:
        collector.form.discard()
        await _drain(stream)
        raise too_large(max_file_bytes) from None
    except _BadForm as exc:
        collector.form.discard()
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None
    except ParseError as exc:  # e.g. MultipartParseError: bytes that break the framing
        collector.form.discard()
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, f"malformed multipart body: {exc}"
        ) from None
    except BaseException:
        collector.form.discard()
        raise
    if not collector.ended:
        collector.form.discard()
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "truncated multipart body")
    return collector.form


async def _drain(stream: object) -> None:
    drained = 0
    deadline = time.monotonic() + DRAIN_S
    with contextlib.suppress(Exception):
        async for chunk in stream:  # type: ignore[attr-defined]
            drained += len(chunk)
            if drained > DRAIN_BYTES or time.monotonic() > deadline:
                break


def missing_field(name: str) -> RequestValidationError:
    return RequestValidationError(
        [{"type": "missing", "loc": ("body", name), "msg": "Field required", "input": None}]
    )
