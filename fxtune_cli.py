"""The `fxtune` command: the composition root that mounts each package's own commands."""

from __future__ import annotations

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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
