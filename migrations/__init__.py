"""Alembic environment and versions: the only way the schema changes.

A package so the wheel carries it: `service/migrations` is a link to this directory, so the
service finds it as `service.migrations` (importlib.resources) in a wheel, an editable install
and a plain checkout alike, while `alembic` run from the repository reads it here.
"""
