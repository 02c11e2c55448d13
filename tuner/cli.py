"""The tuner's own commands; `fxtune_cli` mounts them next to the service's and the worker's."""

from __future__ import annotations

import contextlib
import faulthandler
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tuner.contract.budget import DEFAULT_BUDGET_S, STACKS_AFTER_S
from tuner.contract.device import KINDS, Device
from tuner.contract.errors import FxtuneError, InputError, NoConfigError
from tuner.contract.exit_codes import exit_code_for
from tuner.host.job_caches import DEFAULT_STORE
from tuner.host.sandboxed_tune import Request

app = typer.Typer(no_args_is_help=True, add_completion=False)
console = Console()
err = Console(stderr=True)

ModelArg = Annotated[Path, typer.Argument(help="A torch.export program saved as .pt2")]
DeviceOpt = Annotated[
    Device,
    typer.Option(parser=Device.parse, metavar="DEVICE", help=f"{', '.join(KINDS)}; e.g. cuda:1"),
]


# A run still going this long after its budget is stuck: its threads' stacks go to stderr (the
# worker's stderr.log, whose last dump a stopped or timed-out job's error quotes), before it is
# killed at `tuner.contract.budget.KILL_MARGIN_S`.
OVERRUN_DUMP_S = STACKS_AFTER_S


@contextlib.contextmanager
def stacks_on_overrun(after_s: float) -> Iterator[None]:
    if sys.__stderr__ is None:  # no file descriptor 2 to write to
        yield
        return
    faulthandler.dump_traceback_later(after_s, file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def fail(exc: FxtuneError) -> typer.Exit:
    """The message, and the exit code for the error's type (tuner.contract.exit_codes); only the
    tuner's
    own errors are caught: anything else is a bug and exits INTERNAL (1) with its traceback."""
    err.print(f"[red]error:[/red] {exc}", soft_wrap=True, markup=True, highlight=False)
    return typer.Exit(code=exit_code_for(exc))


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
    from tuner.graph.capture import to_graph_module
    from tuner.loading.bounds import load_bounded
    from tuner.passes import get_pass, pass_names

    try:
        gm = to_graph_module(load_bounded(model))
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
    from tuner.graph.capture import save_program, to_graph_module
    from tuner.loading.bounds import load_bounded
    from tuner.passes.apply import apply_passes, count_ops

    names = [p.strip() for p in passes.split(",") if p.strip()]
    try:
        program = load_bounded(model)
        before = count_ops(to_graph_module(program))
        result = apply_passes(program, names)
        save_program(result.to_program(), out)
    except FxtuneError as exc:
        raise fail(exc) from None
    after = count_ops(result.gm)
    console.print(f"rewrote {len(result.applied)} site(s); ops {before} -> {after}; wrote {out}")
    if result.packers:
        console.print("[yellow]note:[/yellow] the program's inputs changed (combine_sparse_inputs)")


def _progress_printer(json_lines: bool):
    """Progress as JSON lines (for the worker) or a rich bar (for people)."""
    import contextlib
    import json

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if json_lines:

        @contextlib.contextmanager
        def lines():
            def say(fraction: float, message: str) -> None:
                print(json.dumps({"progress": round(fraction, 3), "message": message}), flush=True)

            yield say

        return lines()

    @contextlib.contextmanager
    def bar():
        columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
        with Progress(*columns, console=err) as prog:
            task = prog.add_task("tuning", total=1.0)

            def say(fraction: float, message: str) -> None:
                prog.update(task, completed=fraction, description=message)

            yield say

    return bar()


@app.command("tune")
def tune_cmd(
    model: ModelArg,
    out: Annotated[Path, typer.Option(help="Where to write the tuned .pt2")],
    report: Annotated[Path, typer.Option(help="Where to write the JSON report")],
    device: DeviceOpt = "cpu",
    budget_s: Annotated[
        float, typer.Option("--budget-s", help="Total tuning time budget, seconds")
    ] = DEFAULT_BUDGET_S,
    backend: Annotated[
        list[str] | None, typer.Option(help="Backends to consider (repeatable); default all")
    ] = None,
    cache: Annotated[
        Path | None, typer.Option(help="Decision cache file", envvar="FXTUNE_TUNE_CACHE")
    ] = None,
    no_profile: Annotated[bool, typer.Option("--no-profile", help="Skip profiles")] = False,
    threads: Annotated[
        int | None,
        typer.Option(
            help="CPU threads to tune with (default: torch's default, or the cores that other "
            "work leaves free where fewer)"
        ),
    ] = None,
    progress_json: Annotated[
        bool, typer.Option("--progress-json", help="Progress as JSON lines on stdout")
    ] = False,
    world_size: Annotated[
        int,
        typer.Option(
            "--world-size",
            min=1,
            help="Ranks to spawn (>1: MODEL and --out hold {rank}, one program per rank)",
        ),
    ] = 1,
    sizes: Annotated[
        list[str] | None,
        typer.Option(
            help="Sizes to tune a dynamic dimension at, e.g. batch=1,32,512 (repeatable); "
            "default: each dynamic dim's minimum, the example and a large value"
        ),
    ] = None,
    mode: Annotated[
        str,
        typer.Option(
            help="infer: tune the forward; train: tune a training step (forward, loss, "
            "backward; export the model in train mode)"
        ),
    ] = "infer",
    optimizer: Annotated[
        str | None,
        typer.Option(help="With --mode train: also one optimizer step per step (sgd, adamw)"),
    ] = None,
    sandbox: Annotated[
        bool,
        typer.Option(
            "--sandbox/--no-sandbox",
            envvar="FXTUNE_TUNE_SANDBOX",
            help="Tune in a bubblewrap sandbox, as the worker does (compiling a program runs "
            "code generated from it); --no-sandbox only for a program you trust",
        ),
    ] = True,
    cache_out: Annotated[
        Path | None,
        typer.Option(
            "--cache-out",
            help="Write what this run measures to this folder; --cache is then only read",
        ),
    ] = None,
    warm_caches: Annotated[
        bool,
        typer.Option(
            "--warm-caches/--cold-caches",
            envvar="FXTUNE_TUNE_WARM_CACHES",
            help="Sandboxed: start from compile caches warmed once per user and torch "
            "installation (~/.cache/fxtune/warm; the first run builds them, about 30 s, before "
            "the budget starts), not from empty ones",
        ),
    ] = True,
) -> None:
    """Measure every pass on every site of MODEL, choose a backend, write the tuned program."""
    started = time.monotonic()
    if sandbox:
        cached = cache or DEFAULT_STORE
        passed = _passed_options(device, budget_s, backend, no_profile, threads, sizes, mode)
        passed += ["--world-size", str(world_size)] if world_size > 1 else []
        passed += ["--optimizer", optimizer] if optimizer else []
        request = Request(
            model, out, report, passed, budget_s, str(device), world_size, cached, warm_caches
        )
        _tune_sandboxed(request, progress_json)
        return
    if world_size > 1:
        from tuner.distributed.cli import tune_distributed_cmd

        if sizes:
            raise fail(InputError("--sizes is not supported with --world-size (yet)"))
        if mode != "infer":
            raise fail(InputError("--mode train is not supported with --world-size (yet)"))

        tune_distributed_cmd(model, out, report, world_size, budget_s, threads, console)
        return
    import torch

    from tuner.graph.sizes import parse_sizes
    from tuner.host.load import sample_load, threads_beside
    from tuner.loading.bounds import load_bounded
    from tuner.measure.timing import require_timing, stop_settings
    from tuner.tuning.outputs import write_outputs
    from tuner.tuning.tuner import TuneOptions, tune_program, tuning_session

    cache = cache or DEFAULT_STORE
    try:
        require_timing(device)  # a missing device fails before the model is even read
        stop_settings()  # and so does a malformed FXTUNE_TIMING_ setting
        load = sample_load()
        wanted, held_back = torch.get_num_threads(), 0
        if threads is None and Device.parse(device).kind == "cpu":
            threads = threads_beside(load, wanted)
            held_back = wanted - threads
        options = TuneOptions(
            device=device,
            budget_s=budget_s,
            started=started,  # loading the program counts: the budget is the command's
            backends=backend or None,
            cache_path=cache,
            cache_out=cache_out,
            threads=threads,
            load=load,
            sizes=parse_sizes(sizes) or None,
            mode=mode,  # type: ignore[arg-type]  # checked by TuneOptions
            optimizer=optimizer,
        )
        program = load_bounded(model, budget_s, options.device.kind, options.sizes)
        # The session (threads, work folder) outlives writing: the package is copied out of it.
        with (
            stacks_on_overrun(budget_s + OVERRUN_DUMP_S),
            _progress_printer(progress_json) as say,
            tuning_session(options) as session,
        ):
            outcome = tune_program(program, session, say)
            write_outputs(outcome, out, report, profile=not no_profile, progress=say)
    except FxtuneError as exc:
        raise fail(exc) from None
    from tuner.measure.summary import format_interval

    cfg = outcome.config
    table = Table("candidate", "backend", "speedup", "95% interval", "verdict")
    for fig in cfg.candidates:
        speed = f"{fig.speedup:.2f}x" if fig.speedup else "-"
        table.add_row(fig.name, fig.backend, speed, format_interval(fig.ci), fig.verdict)
    target = console if not progress_json else err
    target.print(table)
    if cfg.whole_model.per_size and not cfg.buckets:
        by_size = Table("size", "speedup", "95% interval", "verdict", title="chosen, per size")
        for f in cfg.whole_model.per_size:
            speed = f"{f.speedup:.2f}x" if f.speedup else "-"
            by_size.add_row(f.label, speed, format_interval(f.ci), f.verdict)
        target.print(by_size)
    if cfg.buckets:
        buckets = Table(
            "bucket", "decision", "size", "speedup", "95% interval", title="size buckets"
        )
        for b in cfg.buckets:
            for f in b.per_size or [None]:
                speed = f"{f.speedup:.2f}x" if f is not None and f.speedup else "-"
                where = f.label if f is not None else ", ".join(f"{b.dim}={m}" for m in b.measured)
                interval = format_interval(f.ci) if f is not None else "-"
                buckets.add_row(b.describe(), b.name, where, speed, interval)
        target.print(buckets)
    accepted = sum(1 for s in cfg.sites if s.accepted)
    if cfg.mode == "train":
        target.print(
            f"training step: loss = {cfg.training.loss if cfg.training else '?'}; optimizer "
            f"{(cfg.training.optimizer if cfg.training else None) or 'none (gradients only)'}"
        )
        versus = cfg.tuning.get("versus_compile")
        if versus and versus.get("speedup"):
            target.print(
                f"{versus['candidate']} over torch.compile of the original step: "
                f"{versus['speedup']:.2f}x, 95% interval {format_interval(versus.get('ci'))}"
            )
    target.print(
        f"chosen: {cfg.whole_model.name} (backend {cfg.backend}); "
        f"{accepted}/{len(cfg.sites)} distinct sites accepted; "
        f"verified: {cfg.verification.passed}; {cfg.tuning['timed_candidates']} timed candidates, "
        f"{cfg.tuning['cache_hits']} cache hits, {cfg.tuning['seconds']} s"
    )
    steps = cfg.tuning.get("seconds_by_step") or {}
    if steps:
        spent = ", ".join(f"{step} {s:.1f} s" for step, s in steps.items() if s >= 0.05)
        target.print(f"where the time went: {spent}")
    if held_back:
        target.print(
            f"measured on {threads} of {wanted} threads (other work held the cores): which "
            f"backend wins can change with the thread count; to deploy on {wanted} threads, "
            f"tune again on a quiet machine or with --threads {wanted}"
        )


def _passed_options(
    device: Device,
    budget_s: float,
    backends: list[str] | None,
    no_profile: bool,
    threads: int | None,
    sizes: list[str] | None,
    mode: str,
) -> list[str]:
    """The options of a sandboxed tune's child (the paths are the sandbox's)."""
    passed = ["--device", str(device), "--budget-s", f"{budget_s:g}", "--mode", mode]
    for name in backends or []:
        passed += ["--backend", name]
    for size in sizes or []:
        passed += ["--sizes", size]
    passed += ["--threads", str(threads)] if threads is not None else []
    return passed + (["--no-profile"] if no_profile else [])


def _tune_sandboxed(request: Request, progress_json: bool) -> None:
    """`fxtune tune` in the sandbox (`tuner.host.sandboxed_tune`); its summary printed here."""
    from tuner.host.sandboxed_tune import ChildFailed, tune_in_sandbox

    try:
        with _progress_printer(progress_json) as say:
            summary = tune_in_sandbox(request, say)
    except ChildFailed as exc:  # its own exit code: the worker's retry rule reads it
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(code=exc.code) from None
    except FxtuneError as exc:
        raise fail(exc) from None
    (err if progress_json else console).print(summary.strip(), markup=False, highlight=False)


@app.command("profile")
def profile_cmd(
    model: ModelArg,
    device: DeviceOpt = "cpu",
    iterations: Annotated[int, typer.Option(min=1, help="Profiled iterations")] = 20,
    trace: Annotated[
        Path | None, typer.Option(help="Write the chrome trace here (opens in Perfetto)")
    ] = None,
) -> None:
    """Profile MODEL on its example inputs: time by op category, ops, kernels, overhead, memory."""
    from tuner.graph.capture import example_inputs
    from tuner.loading.bounds import load_bounded
    from tuner.profiling.profile import profile_callable, profileable
    from tuner.profiling.report import breakdown_table, figure_lines, top_ops_table

    try:
        profileable(device)
        program = load_bounded(model, device_kind=device.kind)
        on = device.torch_device
        inputs = [x.to(on) if hasattr(x, "to") else x for x in example_inputs(program)]
        module = program.module().to(on)
        summary = profile_callable(
            lambda: module(*inputs), device=device, iterations=iterations, trace_path=trace
        )
    except FxtuneError as exc:
        raise fail(exc) from None
    console.print(breakdown_table(summary))
    console.print(top_ops_table(summary))
    for line in figure_lines(summary):
        console.print(line)


def _fetch_runtime(raw: dict, server: str, token: str | None, out: Path, mode: str) -> None:
    """The config's runtime artifact, fetched, checked by digest and as data, at `out`."""
    import shutil
    import tempfile

    from tuner.backends.runtime_files import check_artifact
    from tuner.contract.config import TunedConfig
    from tuner.deploy.runtime_module import RuntimeUnusable, fetch_runtime_artifact

    config = TunedConfig.model_validate(raw)
    if config.runtime is None:
        why = f"the config chose {config.backend}: it ships no runtime artifact"
        raise fail(NoConfigError(why))
    with tempfile.TemporaryDirectory(prefix="fxtune-fetch-") as tmp:
        try:
            path = fetch_runtime_artifact(
                config, server=server, cache_dir=Path(tmp), token=token, mode=mode
            )
            check_artifact(config.backend, path)
        except (RuntimeUnusable, FxtuneError) as exc:
            raise fail(NoConfigError(str(exc))) from None
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out)
    err.print(f"wrote the {config.backend} artifact ({config.runtime.sha256}) to {out}")


@app.command("fetch")
def fetch_cmd(
    target: Annotated[
        str,
        typer.Argument(
            metavar="FINGERPRINT|MODEL.pt2",
            help="A model fingerprint (hex), or a .pt2 program to compute it from",
        ),
    ],
    server: Annotated[str, typer.Option(help="The fxtune service URL", envvar="FXTUNE_SERVER")],
    device: DeviceOpt = "cpu",
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the config here (default: stdout)")
    ] = None,
    token: Annotated[
        str | None, typer.Option(help="Bearer token", envvar="FXTUNE_API_TOKEN")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds for the whole request")] = 10.0,
    mode: Annotated[
        str, typer.Option(help="infer, or train for the training config (--mode train jobs)")
    ] = "infer",
    runtime_out: Annotated[
        Path | None,
        typer.Option(
            "--runtime-out",
            help="Also download the config's runtime artifact (ONNX file or OpenVINO IR zip), "
            "checked as data, here; `tuner.deploy.runtime_module.load_runtime_module` runs it",
        ),
    ] = None,
) -> None:
    """Download the tuned config of a model, for scripts (exit 2 when there is none)."""
    import json
    import re
    from typing import get_args

    from tuner.contract.config import Mode
    from tuner.deploy.client import fetch_config

    if re.fullmatch(r"[0-9a-f]{1,64}", target) and not Path(target).exists():
        fingerprint = target
    elif Path(target).is_file() or target.endswith(".pt2"):
        from tuner.graph.fingerprint import model_fingerprint
        from tuner.loading.load import load_program

        try:
            fingerprint = model_fingerprint(load_program(target))
        except FxtuneError as exc:
            raise fail(exc) from None
    else:
        raise fail(InputError(f"{target!r} is neither a fingerprint (hex) nor a .pt2 file"))
    if mode not in get_args(Mode):
        raise fail(InputError(f"--mode must be one of {', '.join(get_args(Mode))}, not {mode!r}"))
    config, source = fetch_config(
        fingerprint,
        server=server,
        device=device,
        timeout=timeout,
        token=token,
        use_cache=False,
        mode=mode,  # type: ignore[arg-type]  # checked above
    )
    if config is None:
        raise fail(NoConfigError(source))
    if runtime_out is not None:
        _fetch_runtime(config, server, token, runtime_out, mode)
    text = json.dumps(config, indent=2)
    if out is None:
        print(text)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    err.print(f"wrote the {device} config for {fingerprint} to {out}")
