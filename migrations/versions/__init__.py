"""Alembic revisions (alembic skips this file; it makes the directory a package for the wheel)."""
