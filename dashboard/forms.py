"""Form specs without Streamlit: engine option fields read from an engine's options model,
and the SLO inputs' texts.

The Engine page draws one widget per :class:`FieldSpec`, so an engine kind registered
later (vLLM with ``tensor_parallel_size``, ``max_num_batched_tokens``, ``quantization``,
``enable_prefix_caching``, ...) shows its own options without any page change. No
Streamlit here: this module only describes the fields and parses the widgets' values.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from bench.metrics.slo import Slo, SloError, parse_slos
from engines.base import EngineOptions
from engines.errors import ConfigError

# Fields every engine has; the Engine page draws them itself (model, accelerator, dtype, ...).
COMMON_FIELDS: frozenset[str] = frozenset(EngineOptions.model_fields)

Widget = Literal["checkbox", "int", "float", "select", "text", "json"]


@dataclass(frozen=True)
class FieldSpec:
    """How to draw and parse one option field."""

    name: str
    label: str
    widget: Widget
    default: Any
    optional: bool = False  # None is allowed (an empty text box means "engine default")
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    help: str = ""


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        if len(args) == 1:
            return args[0], optional
        return annotation, optional
    return annotation, False


def _bounds(info: FieldInfo) -> tuple[float | None, float | None]:
    lo = hi = None
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            lo = m.ge
        elif isinstance(m, annotated_types.Gt):
            lo = m.gt
        elif isinstance(m, annotated_types.Le):
            hi = m.le
        elif isinstance(m, annotated_types.Lt):
            hi = m.lt
    return lo, hi


def field_spec(name: str, info: FieldInfo) -> FieldSpec:
    """The widget for one pydantic field (unknown types fall back to a JSON text box)."""
    annotation, optional = _strip_optional(info.annotation)
    default = None if info.is_required() else info.get_default(call_default_factory=True)
    label = info.title or name.replace("_", " ")
    help_text = info.description or ""
    lo, hi = _bounds(info)
    common: dict[str, Any] = {"name": name, "label": label, "default": default, "optional": optional, "help": help_text}
    if typing.get_origin(annotation) is Literal:
        # An optional choice offers None first: "engine default" (the engine or library decides).
        choices = ((None,) if optional else ()) + tuple(typing.get_args(annotation))
        return FieldSpec(widget="select", choices=choices, **common)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return FieldSpec(widget="select", choices=tuple(e.value for e in annotation), **common)
    if annotation is bool:
        if optional:  # three states: engine default / on / off
            return FieldSpec(widget="select", choices=(None, True, False), **common)
        return FieldSpec(widget="checkbox", **common)
    if annotation is int:
        return FieldSpec(widget="int", minimum=lo, maximum=hi, **common)
    if annotation is float:
        return FieldSpec(widget="float", minimum=lo, maximum=hi, **common)
    if annotation is str:
        return FieldSpec(widget="text", **common)
    return FieldSpec(widget="json", **common)


# Option groups, in the order the Engine page draws them. The book's 8.2.3 ``LLM(...)``
# arguments come first; what only shapes the client (pool sizes, tensor names, ports) last,
# under "Advanced", closed by default.
GROUP_BOOK = "The book's launch arguments (8.2.3)"
GROUP_SERVER = "Server"
GROUP_CONNECT = "Connection and requests"
GROUP_ADVANCED = "Advanced: client plumbing"
GROUP_TUNING = "Tuning (the book's 8.4.2-8.4.3)"
GROUP_PARALLEL = "Parallelism (several GPUs or nodes)"
OPTION_GROUPS: tuple[str, ...] = (GROUP_BOOK, GROUP_TUNING, GROUP_PARALLEL, GROUP_SERVER, GROUP_CONNECT, GROUP_ADVANCED)

# Each engine option declares its label (Field title) and its group (json_schema_extra "group") in its
# engine's options model; the page draws the groups under these headings, in this order.
GROUP_TITLES: dict[str, str] = {
    "book": GROUP_BOOK,
    "tuning": GROUP_TUNING,
    "parallel": GROUP_PARALLEL,
    "server": GROUP_SERVER,
    "connect": GROUP_CONNECT,
    "advanced": GROUP_ADVANCED,
}


def option_group(info: FieldInfo) -> str:
    """The heading an option is drawn under (its model's ``group``; none: Advanced)."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return GROUP_TITLES.get(str(extra.get("group") or "advanced"), GROUP_ADVANCED)


def option_fields(options_model: type[BaseModel]) -> list[FieldSpec]:
    """The engine-specific fields of an options model (those not common to every engine),
    with their human labels."""
    out = []
    for n, info in options_model.model_fields.items():
        if n in COMMON_FIELDS:
            continue
        out.append(field_spec(n, info))
    return out


def grouped_option_fields(options_model: type[BaseModel]) -> list[tuple[str, list[FieldSpec]]]:
    """The option fields by group, groups in :data:`OPTION_GROUPS` order, empty groups left out."""
    by_group: dict[str, list[FieldSpec]] = {g: [] for g in OPTION_GROUPS}
    for spec in option_fields(options_model):
        by_group[option_group(options_model.model_fields[spec.name])].append(spec)
    return [(g, specs) for g, specs in by_group.items() if specs]


def parse_value(spec: FieldSpec, raw: Any) -> Any:
    """A widget's raw value -> the field value; an empty optional text box -> None.

    Raises :class:`ConfigError` naming the field for unparsable input (pydantic
    validates ranges later, when the options are built).
    """
    if spec.widget in ("text", "json") and isinstance(raw, str):
        text = raw.strip()
        if not text:
            if spec.optional or spec.default is None:
                return None
            return spec.default if spec.widget == "json" else ""
        if spec.widget == "json":
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{spec.name}: not valid JSON ({exc.msg})") from exc
        return text
    if spec.widget == "int" and raw is not None:
        return int(raw)
    if spec.widget == "float" and raw is not None:
        return float(raw)
    return raw


def widget_default(spec: FieldSpec) -> Any:
    """The value a widget starts with (text boxes show JSON or an empty string for None)."""
    if spec.widget == "json":
        return "" if spec.default is None else json.dumps(spec.default)
    if spec.widget == "text":
        return "" if spec.default is None else str(spec.default)
    return spec.default


# --- SLO inputs --------------------------------------------------------------------------------

SLO_NO_PRESET = "none"  # the preset choice that adds no SLO


def slo_texts(preset: str | None, lines: str | None) -> list[str]:
    """The SLO texts of a preset choice and a free-text box: the preset's name first (unless
    :data:`SLO_NO_PRESET`), then each non-empty line. Not checked: see :func:`checked_slos`."""
    texts = [] if not preset or preset == SLO_NO_PRESET else [str(preset)]
    return texts + [line.strip() for line in str(lines or "").splitlines() if line.strip()]


def checked_slos(texts: list[str]) -> list[Slo]:
    """``texts`` parsed (presets expanded, a later SLO on the same metric and statistic wins);
    :class:`ConfigError` with :mod:`bench.metrics.slo`'s one-line reason for the first bad one."""
    try:
        return parse_slos(texts)
    except SloError as exc:
        raise ConfigError(str(exc)) from None
