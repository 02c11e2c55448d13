"""The tuner's own commands; `fxtune_cli` mounts them next to the service's and the worker's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tuner.errors import FxtuneError

app = typer.Typer(no_args_is_help=True, add_completion=False)
console = Console()
err = Console(stderr=True)

ModelArg = Annotated[Path, typer.Argument(help="A torch.export program saved as .pt2")]


def fail(exc: Exception) -> typer.Exit:
    err.print(f"[red]error:[/red] {exc}")
    return typer.Exit(code=2)


@app.command("passes")
def passes_cmd() -> None:
    """List the registered passes in the order they chain."""
    from tuner.passes import get_pass, pass_names

    table = Table("pass", "what it does")
    for name in pass_names():
        table.add_row(name, get_pass(name).description)
    console.print(table)


@app.command("sites")
def sites_cmd(model: ModelArg) -> None:
    """List every pass's sites in MODEL (each pass looks at the original graph)."""
    from tuner.capture import to_graph_module
    from tuner.load import load_program
    from tuner.passes import get_pass, pass_names

    try:
        gm = to_graph_module(load_program(model))
    except FxtuneError as exc:
        raise fail(exc) from None
    table = Table("pass", "site id", "nodes", "what")
    total = 0
    for name in pass_names():
        for site in get_pass(name).find_sites(gm):
            table.add_row(name, site.id, str(len(site.nodes)), site.summary)
            total += 1
    console.print(table)
    console.print(f"{total} site(s)")


@app.command("apply")
def apply_cmd(
    model: ModelArg,
    passes: Annotated[str, typer.Option(help="Comma-separated pass names, applied in order")],
    out: Annotated[Path, typer.Option(help="Where to write the rewritten .pt2")],
) -> None:
    """Apply passes to all their sites and save the rewritten program."""
    from tuner.apply import apply_passes, count_ops
    from tuner.capture import save_program, to_graph_module
    from tuner.load import load_program

    names = [p.strip() for p in passes.split(",") if p.strip()]
    try:
        program = load_program(model)
        before = count_ops(to_graph_module(program))
        result = apply_passes(program, names)
        save_program(result.to_program(), out)
    except FxtuneError as exc:
        raise fail(exc) from None
    after = count_ops(result.gm)
    console.print(f"rewrote {len(result.applied)} site(s); ops {before} -> {after}; wrote {out}")
    if result.packers:
        console.print("[yellow]note:[/yellow] the program's inputs changed (combine_sparse_inputs)")
