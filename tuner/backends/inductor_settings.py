"""Inductor's own settings as whole-model candidates: named sets of inductor config values.

A user tuning by hand tries inductor's knobs; fxtune times them as candidates under the
inductor backend (an AOTInductor package built with them) and records the name in the config
(`Figures.settings`). Measured on 2 cores (torch 2.13): freezing 1.00x, concat-linear 1.00-1.01x,
max-autotune with the C++ GEMM template 1.01-1.03x over the default on the recommendation model
and the CNN, 1.11x on resnet18 and 0.2x on bert_mini (issue 48): only measurement decides.

Only these names exist: a config names a setting, never the values, so nothing from a config or
an upload reaches inductor's config. A setting whose keys this torch's inductor lacks is not
offered (`available`).
"""

from __future__ import annotations

from typing import Any

# By device kind, in the order they are tried (the largest gain measured first).
SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "cpu": {
        "max-autotune": {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"},
        "freezing": {"freezing": True},
        "concat-linear": {"freezing": True, "cpp.enable_concat_linear": True},
    },
}

# How much faster than the same candidate's default build a setting has been seen to run:
# a candidate whose best inductor build, this much faster, stays below the best measured
# speed is not built again with settings (`tuner.tuning.promise.with_settings`).
BEST_GAIN = 1.15


def _has(key: str) -> bool:
    from tuner.host.torch_compat import private

    holder: Any = private("torch._inductor.config")
    for part in key.split("."):
        if not hasattr(holder, part):
            return False
        holder = getattr(holder, part)
    return True


def available(device_kind: str) -> list[str]:
    """The settings this device and this torch's inductor have, in the order to try them."""
    named = SETTINGS.get(device_kind, {})
    return [name for name, values in named.items() if all(_has(k) for k in values)]


def values_of(name: str | None, device_kind: str) -> dict[str, Any]:
    """The inductor config of a setting (`{}` for None: inductor's defaults)."""
    if name is None:
        return {}
    try:
        return dict(SETTINGS[device_kind][name])
    except KeyError:
        raise ValueError(f"no inductor setting {name!r} on {device_kind}") from None


def label(name: str | None) -> str:
    """How a candidate's name shows its setting: " [max-autotune]", or nothing."""
    return f" [{name}]" if name else ""
