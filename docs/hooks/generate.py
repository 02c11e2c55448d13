"""The docs site's generated pages, made from the code at every `mkdocs build` (offline).

- `reference/http-api.md` and `reference/openapi.json`: the service app's own OpenAPI document
  (`service.main.create_app(...).openapi()`), rendered to Markdown here, so the API reference is
  what the code serves and needs no script or CDN in the browser.
- `reference/settings.md`: its `<!-- settings:service -->` and `<!-- settings:worker -->` markers
  become tables of the pydantic settings objects (`service.core.config.Settings`,
  `worker.config.WorkerSettings`): every field, its variable, type, default and description.
- `changelog.md`: the repository's CHANGELOG.md.

Nothing here can drift from the code: a renamed route or a new setting shows up at the next
build, and `make test` builds with `--strict`.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
SETTINGS_MARKER = re.compile(r"<!-- settings:(service|worker) -->")
API_PAGE = "reference/http-api.md"
SPEC_FILE = "reference/openapi.json"
# What the fields without a `description` of their own mean (read from the code that uses them).
# A key whose field is gone fails the build: this table must follow the settings.
EXTRA_HELP: dict[str, str] = {
    "data_dir": "The service's folder: the SQLite database (unless FXTUNE_DATABASE_URL is set) "
    "and artifacts/ (uploads and results, content-addressed by sha256)",
    "database_url": "sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB (needs the "
    "postgres extra); unset: SQLite in the data dir",
    "api_token": "Bearer token of users (uploads, jobs, configs); unset: no token is asked "
    "from clients on loopback",
    "max_upload_mb": "Cap on an uploaded .pt2 (413 above it, checked while the body streams in)",
    "max_result_mb": "Cap on a worker's result upload (report, tuned program, packages, traces)",
    "lease_s": "How long a claimed job stays a worker's without a heartbeat; then it is requeued",
    "max_attempts": "Attempts per job before it stays failed (errors a retry cannot fix fail at "
    "once)",
    "retry_backoff_s": "Wait before a failed job's next attempt, doubling per attempt",
    "retry_backoff_max_s": "The longest wait between attempts",
    "reap_interval_s": "How often the service requeues jobs whose lease expired",
    "server": "The service URL the worker claims jobs from",
    "worker_poll_s": "Seconds between claims while no job is queued",
    "worker_scratch_dir": "Where job folders are made (default: the system temporary folder)",
}


# ----------------------------------------------------------------------------------- settings


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = re.sub(r"\b(?:pathlib|pydantic\.types|typing)\.", "", text)
    return text.replace("SecretStr", "secret").replace("|", "\\|")


def _constraints(metadata: list[Any]) -> str:
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    parts = []
    for item in metadata:
        for attr, sign in signs.items():
            if getattr(item, attr, None) is not None:
                parts.append(f"{sign} {getattr(item, attr)}")
        if getattr(item, "__name__", "") == "NoDecode":
            parts.append("comma-separated")
    return ", ".join(parts)


def _shown_default(field: Any) -> str:
    """The default as a user reads it: paths under the home folder as `~`, the interpreter as
    `python`, so the page is the same whoever builds it."""
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None:
        return "unset"
    text = json.dumps(value) if isinstance(value, list) else str(value)
    text = text.replace(sys.executable, "python").replace(str(Path.home()), "~")
    return f"`{text}`"


def settings_table(model: type) -> str:
    fields = model.model_fields
    stale = [name for name in EXTRA_HELP if name not in _all_fields()]
    if stale:
        raise KeyError(f"docs/hooks/generate.py EXTRA_HELP names settings that are gone: {stale}")
    prefix = model.model_config.get("env_prefix", "")
    lines = [
        "| variable | type | default | allowed | what it does |",
        "|---|---|---|---|---|",
    ]
    for name, field in fields.items():
        what = (field.description or EXTRA_HELP.get(name, "")).replace("|", "\\|")
        lines.append(
            f"| `{prefix}{name.upper()}` | {_type_name(field.annotation)} | "
            f"{_shown_default(field)} | {_constraints(field.metadata)} | {' '.join(what.split())} |"
        )
    return "\n".join(lines) + "\n"


def _settings_models() -> dict[str, type]:
    from service.core.config import Settings
    from worker.config import WorkerSettings

    return {"service": Settings, "worker": WorkerSettings}


def _all_fields() -> set[str]:
    return {name for model in _settings_models().values() for name in model.model_fields}


# ------------------------------------------------------------------------------------ openapi


def openapi_spec() -> dict[str, Any]:
    """The service's OpenAPI document, from an app built with throw-away settings (nothing
    starts: the lifespan only runs when a server does)."""
    from service.core.config import Settings
    from service.main import create_app

    with tempfile.TemporaryDirectory() as tmp:
        return create_app(Settings(data_dir=Path(tmp))).openapi()


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "", name.lower().replace(" ", "-"))


def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_slug(name)})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_schema_type(s) for s in schema[key])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return "array of " + _schema_type(schema.get("items", {}))
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return "object of " + _schema_type(schema["additionalProperties"])
    return f"{kind} ({schema['format']})" if "format" in schema else kind


def _text(value: Any) -> str:
    return " ".join(str(value or "").split()).replace("|", "\\|")


def _operation(method: str, path: str, op: dict[str, Any]) -> list[str]:
    out = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        out += [f"**{op['summary']}**", ""]
    if op.get("description"):
        out += [op["description"].strip(), ""]
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in params:
            out.append(
                f"| `{p['name']}` | {p['in']} | {_schema_type(p.get('schema', {}))} | "
                f"{'yes' if p.get('required') else 'no'} | {_text(p.get('description'))} |"
            )
        out.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            schema = content.get("schema", {})
            out += [f"Request body (`{media}`): {_schema_type(schema)}", ""]
            if schema.get("properties"):
                out += _fields(schema)
    out += ["| status | meaning | body |", "|---|---|---|"]
    for status, resp in op.get("responses", {}).items():
        bodies = [
            f"`{media}` {_schema_type(c.get('schema', {}))}"
            for media, c in resp.get("content", {}).items()
        ]
        out.append(f"| {status} | {_text(resp.get('description'))} | {', '.join(bodies) or '-'} |")
    return [*out, ""]


def _schema_section(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"### {name}", ""]
    if schema.get("description"):
        out += [" ".join(schema["description"].split()), ""]
    if not schema.get("properties"):
        return [*out, _schema_type(schema), ""]
    return [*out, *_fields(schema)]


def _fields(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    out = ["| field | type | required | description |", "|---|---|---|---|"]
    for prop, sub in schema["properties"].items():
        out.append(
            f"| `{prop}` | {_schema_type(sub)} | {'yes' if prop in required else 'no'} | "
            f"{_text(sub.get('description') or sub.get('title'))} |"
        )
    return [*out, ""]


def api_markdown(spec: dict[str, Any]) -> str:
    info = spec["info"]
    lines = [
        "# HTTP API",
        "",
        f"{info.get('summary', info['title'])}, version {info['version']}. Generated from the "
        "service's own OpenAPI document at build time; the running service serves the same "
        "document at `/openapi.json` and an interactive page at `/docs`. "
        f"[Download this build's openapi.json](openapi.json).",
        "",
        "Authentication, the Host check and the limits on request bodies are described in "
        "[the security model](../security.md).",
        "",
        "## Routes",
        "",
    ]
    groups: dict[str, list[str]] = {}
    for path, item in spec["paths"].items():
        group = path.removeprefix("/api/v1/").split("/")[0].split(".")[0] or "root"
        for method, op in item.items():
            if method in ("get", "post", "put", "patch", "delete"):
                groups.setdefault(group, []).extend(_operation(method, path, op))
    for group, body in groups.items():
        lines += [f"## {group}", "", *body]
    lines += ["## Schemas", ""]
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        lines += _schema_section(name, schema)
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ mkdocs


def on_files(files: Files, config: Any) -> Files:
    spec = openapi_spec()
    files.append(File.generated(config, API_PAGE, content=api_markdown(spec)))
    files.append(File.generated(config, SPEC_FILE, content=json.dumps(spec, indent=1)))
    changelog = (REPO / "CHANGELOG.md").read_text()
    files.append(File.generated(config, "changelog.md", content=changelog))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    models = _settings_models()
    return SETTINGS_MARKER.sub(lambda m: settings_table(models[m.group(1)]), markdown)
