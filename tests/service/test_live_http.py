"""Oversize uploads against a real HTTP server: the client sees the 413, the disk sees nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx

from service.core.config import Settings
from tests.service.helpers import blob_count, spool_count, thread_server

MB = 1 << 20


def chunked_body(total_mb: int) -> Iterator[bytes]:
    yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.pt2"\r\n\r\n'
    for _ in range(total_mb * 16):
        yield b"x" * (MB // 16)


def test_oversize_uploads_are_refused_with_and_without_content_length(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        max_upload_mb=1,
    )
    with thread_server(settings) as (url, _):
        declared = httpx.post(
            f"{url}/api/v1/models", files={"file": ("x.pt2", b"x" * (3 * MB))}, timeout=60
        )
        chunked = httpx.post(
            f"{url}/api/v1/models",
            content=chunked_body(8),
            headers={"content-type": "multipart/form-data; boundary=b"},
            timeout=60,
        )
        for resp in (declared, chunked):
            assert resp.status_code == 413
            assert resp.json() == {"detail": "upload larger than the limit of 1 MB"}
        assert "content-length" not in chunked.request.headers
        assert httpx.get(f"{url}/api/v1/models").json() == []
    assert blob_count(settings.data_dir) == 0 and spool_count(settings.data_dir) == 0
