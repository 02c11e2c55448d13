"""The `fxtune` command: the composition root that mounts each package's own commands."""

from __future__ import annotations

from typing import Annotated

import typer

from service.cli import app as service_app
from tuner.cli import app as tuner_app
from worker.cli import app as worker_app

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Autotune torch.export programs."
)
app.add_typer(tuner_app, name=None)
app.add_typer(service_app, name=None)
app.add_typer(worker_app, name=None)


def _print_version(value: bool) -> None:
    if value:
        from tuner.host.versions import version_lines

        typer.echo("\n".join(version_lines()))
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print fxtune's, torch's and Python's versions and the optional runtimes found",
        ),
    ] = False,
) -> None:
    """Autotune torch.export programs."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
