"""The `fxtune` command: the composition root that mounts each package's own commands."""

from __future__ import annotations

import typer

from tuner.cli import app as tuner_app

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Autotune torch.export programs."
)
app.add_typer(tuner_app, name=None)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
