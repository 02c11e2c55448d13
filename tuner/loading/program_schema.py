"""A strict schema for an uploaded program's JSON, checked before any torch deserializer sees it.

torch's deserializer trusts its input: it hands expression strings to `sympy.sympify` (an `eval`),
pastes `guards_code` into a function and `exec`s it when `.module()` is built, and lets FX write
parameter names and keyword names into generated source. So the JSON is walked here against the
schema torch's own dataclasses declare (`torch._export.serde.schema`: which keys exist and their
types), and every string field gets a rule of fxtune's (`STRING_RULES`): an identifier, a dotted
module path, an operator the op policy accepts, an expression in fxtune's grammar
(`tuner.loading.sym_expr`, re-printed from its parse tree), an operator's string argument checked
against that operator's allowlist (`tuner.contract.op_strings`: Inductor's C++ generator pastes
some of them into source unescaped), a short token (constant inputs), or dropped (guard code and
per-node metadata, which fxtune does not use). Unknown
keys, unknown string fields (a newer torch's schema) and custom objects are refused, so the check
fails closed. What comes out is a new, sanitized dict; the caller serializes that, not the upload.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import keyword
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from tuner.contract.errors import ArtifactFormatError, LoaderUnavailableError, UnsafeArtifactError
from tuner.contract.op_strings import checked_argument, constant_token
from tuner.host.torch_compat import private
from tuner.loading.op_policy import refusal
from tuner.loading.sym_expr import canonical_expression, check_guard, check_range_key

MAX_DEPTH = 200
MAX_NAME = 255
MAX_LIST = 10_000_000
INT_LIMIT = 2**63

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
_FQN_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")
_PAYLOAD_PATH = re.compile(r"(weight|tensor)_\d{1,9}")
_TORCH_VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,64}")
_VERIFIER = re.compile(r"[A-Z_]{1,32}")
_CONTEXT_KEY = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
DEVICE_TYPES = frozenset({"cpu", "cuda", "meta", "xla", "mps", "xpu"})
# Pytree node types whose unflattening only builds containers (no imports, no user classes).
TREESPEC_TYPES = frozenset(
    {
        None,
        "builtins.tuple",
        "builtins.list",
        "builtins.dict",
        "collections.OrderedDict",
        "collections.namedtuple",
        "torch.fx.immutable_collections.immutable_list",
        "torch.fx.immutable_collections.immutable_dict",
    }
)


def _bad(path: str, why: str) -> UnsafeArtifactError:
    return UnsafeArtifactError(f"refused program JSON at {path}: {why}")


def identifier(value: str, path: str) -> str:
    if not _IDENT.fullmatch(value) or keyword.iskeyword(value):
        raise _bad(path, f"{_shown(value)} is not an identifier")
    return value


def dotted_path(value: str, path: str, allow_empty: bool = False) -> str:
    if value == "" and allow_empty:
        return value
    parts = value.split(".")
    if len(value) > 4 * MAX_NAME or not all(_FQN_PART.fullmatch(p) for p in parts):
        raise _bad(path, f"{_shown(value)} is not a dotted name")
    if any(keyword.iskeyword(p) for p in parts):
        raise _bad(path, f"{_shown(value)} contains a Python keyword")
    return value


def operator_target(value: str, path: str) -> str:
    dotted_path(value, path)
    why = refusal(value)
    if why is not None:
        raise _bad(path, f"operator {value} is refused: {why}")
    return value


def constant_string(value: str, path: str) -> str:
    """A string outside any operator's arguments (a constant input export specialized on)."""
    try:
        return constant_token(value)
    except UnsafeArtifactError as exc:
        raise _bad(path, str(exc)) from None


def _pattern(regex: re.Pattern[str], what: str) -> Callable[[str, str], str]:
    def check(value: str, path: str) -> str:
        if not regex.fullmatch(value):
            raise _bad(path, f"{_shown(value)} is not {what}")
        return value

    return check


def device_type(value: str, path: str) -> str:
    if value not in DEVICE_TYPES:
        raise _bad(path, f"device type {_shown(value)} is not accepted")
    return value


def expression(value: str, path: str) -> str:
    try:
        return canonical_expression(value)
    except UnsafeArtifactError as exc:
        raise _bad(path, str(exc)) from None


def refuse_custom(value: str, path: str) -> str:
    raise _bad(path, "custom (torchbind) objects are native code and are not accepted")


def _context(value: Any, path: str, depth: int = 0) -> None:
    if depth > 8:
        raise _bad(path, "a pytree context is nested too deeply")
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, str):
        if not _CONTEXT_KEY.fullmatch(value):
            raise _bad(path, f"pytree key {_shown(value)} is not accepted")
        return
    if isinstance(value, list):
        for item in value:
            _context(item, path, depth + 1)
        return
    raise _bad(path, "a pytree context holds something other than keys")


def _treespec_node(node: Any, path: str, depth: int = 0) -> None:
    if depth > MAX_DEPTH or not isinstance(node, dict):
        raise _bad(path, "malformed pytree spec")
    if set(node) != {"type", "context", "children_spec"}:
        raise _bad(path, f"pytree spec keys {sorted(node)} are not the expected ones")
    if node["type"] not in TREESPEC_TYPES:
        raise _bad(path, f"pytree node type {_shown(str(node['type']))} is not accepted")
    context = node["context"]
    if context is not None:
        if not isinstance(context, str):
            raise _bad(path, "a pytree context must be JSON text")
        try:
            _context(json.loads(context), path)
        except ValueError:
            raise _bad(path, "a pytree context is not JSON") from None
    children = node["children_spec"]
    if not isinstance(children, list):
        raise _bad(path, "pytree children must be a list")
    for child in children:
        _treespec_node(child, path, depth + 1)


def treespec(value: str, path: str) -> str:
    """An input/output pytree spec: JSON of containers and keys, nothing torch would import."""
    if len(value) > 1_000_000:
        raise _bad(path, "a pytree spec is too long")
    try:
        doc = json.loads(value)
    except ValueError:
        raise _bad(path, "a pytree spec is not JSON") from None
    if not (isinstance(doc, list) and len(doc) == 2 and isinstance(doc[0], int)):
        raise _bad(path, "a pytree spec is not [protocol, tree]")
    _treespec_node(doc[1], path)
    return value


def _shown(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:57] + "...")


Rule = Callable[[str, str], str]
_fqn: Rule = dotted_path
_payload_path: Rule = _pattern(_PAYLOAD_PATH, "a payload member name")

# (schema class, field) -> the rule for that string field (for list[str], for each item).
STRING_RULES: dict[tuple[str, str], Rule] = {
    ("Device", "type"): device_type,
    ("SymExpr", "expr_str"): expression,
    ("SymIntArgument", "as_name"): identifier,
    ("SymFloatArgument", "as_name"): identifier,
    ("SymBoolArgument", "as_name"): identifier,
    ("TensorArgument", "name"): identifier,
    ("TokenArgument", "name"): identifier,
    ("GraphArgument", "name"): identifier,
    ("CustomObjArgument", "name"): refuse_custom,
    ("CustomObjArgument", "class_fqn"): refuse_custom,
    # Strings passed to an operator: `_Walker.string_argument` (tuner.contract.op_strings).
    ("Argument", "as_string"): constant_string,
    ("Argument", "as_strings"): constant_string,
    ("Argument", "as_operator"): operator_target,
    ("NamedArgument", "name"): lambda value, path: value and identifier(value, path),  # HOPs: ""
    ("Node", "target"): operator_target,
    ("Node", "name"): identifier,
    ("ConstantValue", "as_string"): constant_string,
    ("InputToConstantInputSpec", "name"): identifier,
    ("InputToParameterSpec", "parameter_name"): _fqn,
    ("InputToBufferSpec", "buffer_name"): _fqn,
    ("InputToTensorConstantSpec", "tensor_constant_name"): _fqn,
    ("InputToCustomObjSpec", "custom_obj_name"): refuse_custom,
    ("BufferMutationSpec", "buffer_name"): _fqn,
    ("ParameterMutationSpec", "parameter_name"): _fqn,
    ("GradientToParameterSpec", "parameter_name"): _fqn,
    ("GradientToUserInputSpec", "user_input_name"): identifier,
    ("UserInputMutationSpec", "user_input_name"): identifier,
    ("ModuleCallSignature", "in_spec"): treespec,
    ("ModuleCallSignature", "out_spec"): treespec,
    ("ModuleCallSignature", "forward_arg_names"): identifier,
    ("ModuleCallEntry", "fqn"): functools.partial(dotted_path, allow_empty=True),
    ("NamedTupleDef", "field_names"): identifier,
    ("ExportedProgram", "verifiers"): _pattern(_VERIFIER, "a verifier name"),
    ("ExportedProgram", "torch_version"): _pattern(_TORCH_VERSION, "a version"),
    ("PayloadMeta", "path_name"): _payload_path,
}
# (schema class, dict field) -> the rule for its keys.
KEY_RULES: dict[tuple[str, str], Rule] = {
    ("Argument", "as_string_to_argument"): identifier,
    ("Graph", "tensor_values"): identifier,
    ("Graph", "sym_int_values"): identifier,
    ("Graph", "sym_bool_values"): identifier,
    ("Graph", "sym_float_values"): identifier,
    ("Graph", "custom_obj_values"): refuse_custom,
    ("GraphModule", "treespec_namedtuple_fields"): _fqn,
    ("ExportedProgram", "opset_version"): identifier,
    ("ExportedProgram", "range_constraints"): lambda value, path: _range_key(value, path),
    ("PayloadConfig", "config"): _fqn,
}
# Fields fxtune drops: guard code is checked (`check_guard`) but never executed (the range
# constraints still check sizes),
# and node/module metadata (stack traces, module stacks) is not used by fxtune.
DROPPED: dict[tuple[str, str], Any] = {
    ("ExportedProgram", "guards_code"): [],
    ("Node", "metadata"): {},
    ("GraphModule", "metadata"): {},
}


def _check_guards(guards: Any, path: str) -> None:
    if not isinstance(guards, list) or len(guards) > 100_000:
        raise _bad(path, "expected a list of guards")
    for i, guard in enumerate(guards):
        try:
            check_guard(guard)
        except UnsafeArtifactError as exc:
            raise _bad(f"{path}[{i}]", str(exc)) from None


def _range_key(value: str, path: str) -> str:
    try:
        return check_range_key(value)
    except UnsafeArtifactError as exc:
        raise _bad(path, str(exc)) from None


@functools.cache
def _schema() -> types.ModuleType:
    try:
        schema = private("torch._export.serde.schema")
        union = private("torch._export.serde.union")
        schema.ExportedProgram, schema.PayloadConfig, union._Union  # noqa: B018 - probed
    except (ImportError, AttributeError) as exc:
        raise LoaderUnavailableError(
            f"this torch lacks the export schema fxtune checks programs against ({exc})"
        ) from None
    return schema


@functools.cache
def _fields(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, globalns=vars(_schema()))


def _is_union(cls: type) -> bool:
    union = private("torch._export.serde.union")
    return isinstance(cls, type) and issubclass(cls, union._Union)


# Where a string argument sits: the node that passes it and the argument's name.
_CONTEXT_RECORDS = frozenset({"Node", "NamedArgument", "Graph"})
_ARGUMENT_STRINGS = frozenset({("Argument", "as_string"), ("Argument", "as_strings")})


class _Walker:
    """Checks a JSON value against a schema type and returns its sanitized copy.

    It keeps a stack of the nodes, named arguments and graphs it is inside, so a string argument
    is checked against the rule of the operator and argument it is passed to."""

    def __init__(self) -> None:
        self._inside: list[tuple[str, Any]] = []

    def string_argument(self, value: str, owner: tuple[str, str], path: str) -> str:
        if len(self._inside) >= 2:
            (node, target), (arg, name) = self._inside[-2:]
            if node == "Node" and arg == "NamedArgument":
                if not isinstance(target, str) or not isinstance(name, str):
                    raise _bad(path, "a string argument of a malformed node")
                try:
                    return checked_argument(target, name, value)
                except UnsafeArtifactError as exc:
                    raise _bad(path, str(exc)) from None
        return STRING_RULES[owner](value, path)

    def walk(self, tp: Any, value: Any, owner: tuple[str, str], path: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise _bad(path, "nested too deeply")
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if value is None and len(args) < len(typing.get_args(tp)):
                return None
            if len(args) != 1:
                raise _bad(path, "an ambiguous union in the schema")
            return self.walk(args[0], value, owner, path, depth)
        if origin is list:
            if not isinstance(value, list) or len(value) > MAX_LIST:
                raise _bad(path, "expected a list")
            (item,) = typing.get_args(tp)
            return [
                self.walk(item, v, owner, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)
            ]
        if origin is dict:
            if not isinstance(value, dict):
                raise _bad(path, "expected an object")
            _, item = typing.get_args(tp)
            key_rule = KEY_RULES.get(owner)
            if key_rule is None:
                raise _bad(path, f"fxtune has no rule for the keys of {'.'.join(owner)}")
            return {
                key_rule(str(k), path): self.walk(item, v, owner, f"{path}.{k}", depth + 1)
                for k, v in value.items()
            }
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self.record(tp, value, path, depth)
        return self.scalar(tp, value, owner, path)

    def record(self, cls: type, value: Any, path: str, depth: int) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _bad(path, f"expected a {cls.__name__} object")
        fields = _fields(cls)
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise _bad(path, f"unknown key {_shown(str(unknown[0]))} in {cls.__name__}")
        if _is_union(cls) and len(value) != 1:
            raise _bad(path, f"a {cls.__name__} must have exactly one key")
        if cls.__name__ not in _CONTEXT_RECORDS:
            return self._fields_of(cls, fields, value, path, depth)
        self._inside.append((cls.__name__, value.get("target", value.get("name"))))
        try:
            return self._fields_of(cls, fields, value, path, depth)
        finally:
            self._inside.pop()

    def _fields_of(
        self, cls: type, fields: dict[str, Any], value: dict[str, Any], path: str, depth: int
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, field_value in value.items():
            owner = (cls.__name__, name)
            if owner == ("ExportedProgram", "guards_code"):
                _check_guards(field_value, f"{path}.{name}")
            if owner in DROPPED:
                out[name] = DROPPED[owner]
                continue
            out[name] = self.walk(fields[name], field_value, owner, f"{path}.{name}", depth + 1)
        return out

    def scalar(self, tp: Any, value: Any, owner: tuple[str, str], path: str) -> Any:
        if tp is str:
            rule = STRING_RULES.get(owner)
            if rule is None:
                raise _bad(path, f"fxtune has no rule for the string field {'.'.join(owner)}")
            if not isinstance(value, str):
                raise _bad(path, "expected a string")
            if owner in _ARGUMENT_STRINGS:
                return self.string_argument(value, owner, path)
            return rule(value, path)
        if tp is bool:
            if not isinstance(value, bool):
                raise _bad(path, "expected true or false")
            return value
        if isinstance(tp, type) and issubclass(tp, enum.IntEnum):
            if type(value) is not int or value not in {m.value for m in tp}:
                raise _bad(path, f"{value!r} is not a {tp.__name__}")
            return value
        if tp is int:
            if type(value) is not int or not -INT_LIMIT <= value < INT_LIMIT:
                raise _bad(path, "expected a 64-bit integer")
            return value
        if tp is float:
            if type(value) in (int, float) or value in ("Infinity", "-Infinity", "NaN"):
                return value
            raise _bad(path, "expected a number")
        raise _bad(path, f"fxtune has no rule for values of type {tp!r}")


def sanitize_program(program: Any) -> dict[str, Any]:
    """The program JSON, checked against the schema and rules, with dropped fields emptied."""
    if not isinstance(program, dict):
        raise ArtifactFormatError("the program JSON is not an object")
    return _Walker().record(_schema().ExportedProgram, program, "program", 0)


def sanitize_payload_config(config: Any, what: str) -> dict[str, Any]:
    """A weights or constants config (`PayloadConfig`), checked the same way."""
    if not isinstance(config, dict):
        raise ArtifactFormatError(f"{what} is not an object")
    return _Walker().record(_schema().PayloadConfig, config, what, 0)
