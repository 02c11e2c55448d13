"""Files the service reads at run time, found as package data and never through the checkout.

The wheel is the product: templates, static files, the vendored Chart.js and the Alembic
migrations live inside the installed packages (`service.dashboard`, `service.migrations`), so
`fxtune serve` works from any directory of any install. `importlib.resources` finds them the
same way in a wheel, an editable install and a plain checkout.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def package_dir(package: str, *parts: str) -> Path:
    """The directory `parts` inside `package`, as a real path (Jinja2, Starlette and Alembic
    read directories by path, so a zipped install could not serve them: refuse it clearly)."""
    resource = files(package).joinpath(*parts)
    if not isinstance(resource, Path) or not resource.is_dir():
        raise RuntimeError(
            f"fxtune's package data {package}/{'/'.join(parts)} is not a directory on disk "
            f"({resource!r}); install fxtune from its wheel with pip (unzipped)"
        )
    return resource
