"""A tool's arguments from its function: a pydantic model of the signature, its JSON schema, the docstring.

The first parameter of a tool receives the idempotency key and is not shown to
the model. Every other parameter becomes a field: its type hint (any type
pydantic validates: ``int``, ``Literal[...]``, ``list[str]``, a pydantic model,
``Annotated[..., Field(...)]``), its default, and its description from the
docstring's ``Args:`` section (Google style) or ``:param name:`` lines.
Arguments not in the signature are refused, unless it takes ``**kwargs``.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Annotated, Any

import pydantic

from statekeep.errors import InvalidInputError


def describe(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description of a function (its docstring up to the first section) and of its parameters.

    Examples:
        >>> def send(key: str, to: str) -> None:
        ...     '''Email a quote.
        ...
        ...     Args:
        ...         to: the customer's address
        ...     '''
        >>> describe(send)
        ('Email a quote.', {'to': "the customer's address"})
    """
    doc = inspect.getdoc(fn) or ""
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    entry_indent: int | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        field = _FIELD.match(stripped)
        if field:  # Sphinx: ":param name: text", ":returns: text"
            section, current = "sphinx", None
            if field.group(1) in ("param", "parameter", "arg", "argument") and field.group(2):
                current = field.group(2).split()[-1]
                params[current] = field.group(3).strip()
            continue
        header = _SECTION.fullmatch(stripped)
        if header and indent == 0:
            section, current, entry_indent = header.group(1), None, None
            continue
        if section is None:
            summary.append(line)
        elif not stripped:
            continue
        elif section in _ARGS:
            entry_indent = indent if entry_indent is None else entry_indent
            entry = _ENTRY.match(stripped)
            if entry and indent <= entry_indent:
                current = entry.group(1).lstrip("*")
                params[current] = entry.group(2).strip()
            elif current is not None:
                params[current] = f"{params[current]} {stripped}".strip()
        elif section == "sphinx" and current is not None and indent > 0:
            params[current] = f"{params[current]} {stripped}".strip()
    return "\n".join(summary).strip(), {k: v for k, v in params.items() if v}


_ARGS = ("Args", "Arguments", "Parameters", "Params", "Keyword Args", "Keyword Arguments")
_SECTION = re.compile(
    r"(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns?|Raises|Yields|"
    r"Examples?|Notes?|Warnings?|See Also|Attributes):"
)
_FIELD = re.compile(r":(\w+)(?:\s+([^:]+))?:\s*(.*)")
_ENTRY = re.compile(r"(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")


def arguments_model(fn: Callable[..., Any], name: str) -> type[pydantic.BaseModel]:
    """A pydantic model of the arguments the model passes to ``fn`` (all parameters but the first).

    Raises:
        InvalidInputError: ``fn`` takes no idempotency-key parameter (its first, named
            ``key`` or ending in ``key``), has positional-only parameters after it, or a
            type hint pydantic cannot validate.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"has no inspectable signature: {exc}", field="fn") from exc
    params = list(signature.parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not params or params[0].kind not in positional:
        raise InvalidInputError(
            "a tool's first parameter receives the idempotency key: def tool(key, ...)", field="fn"
        )
    if not params[0].name.lower().endswith("key"):  # lambda city: ... would take the key as the city
        raise InvalidInputError(
            f"a tool's first parameter receives the idempotency key, so it is named key (or ends in "
            f"'key'), not {params[0].name!r}: def tool(key, {params[0].name}, ...)",
            field="fn",
        )
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # an unresolvable forward reference: validate those parameters as Any
        hints = {}
    _, docs = describe(fn)
    fields: dict[str, Any] = {}
    extra = "forbid"
    for p in params[1:]:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            extra = "allow"
            continue
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise InvalidInputError(
                f"parameter {p.name!r} is positional-only; a model passes arguments by name", field="fn"
            )
        annotation = hints.get(p.name, Any)
        if p.name in docs and not _described(annotation):
            annotation = Annotated[annotation, pydantic.Field(description=docs[p.name])]
        fields[p.name] = (annotation, ... if p.default is inspect.Parameter.empty else p.default)
    config = pydantic.ConfigDict(extra=extra, arbitrary_types_allowed=False)  # type: ignore[typeddict-item]
    try:
        model = pydantic.create_model(f"{_title(name)}Arguments", __config__=config, **fields)
        model.model_json_schema()
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as exc:
        raise InvalidInputError(
            f"a type hint cannot be turned into a JSON schema: {exc}", field="fn"
        ) from exc
    return model


def json_schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """The JSON schema a model is shown for these arguments (without pydantic's titles)."""
    return _untitled(model.model_json_schema())  # type: ignore[no-any-return]


def explain(error: pydantic.ValidationError) -> str:
    """A validation error as one line a model can act on."""
    parts = []
    for e in error.errors(include_url=False):
        where = ".".join(str(p) for p in e["loc"]) or "arguments"
        if e["type"] == "extra_forbidden":
            parts.append(f"{where}: no such argument")
        elif e["type"] == "missing":
            parts.append(f"{where}: missing")
        else:
            parts.append(f"{where}: {e['msg']} (got {e.get('input')!r})")
    return "; ".join(parts)


def _described(annotation: Any) -> bool:
    """True when ``Annotated[..., Field(description=...)]`` already describes the parameter."""
    metadata = getattr(annotation, "__metadata__", ())
    return any(isinstance(m, pydantic.fields.FieldInfo) and m.description for m in metadata)


def _untitled(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "title" and isinstance(value, str):
                continue
            if key in ("properties", "$defs", "patternProperties") and isinstance(value, dict):
                out[key] = {name: _untitled(sub) for name, sub in value.items()}
            elif key in ("default", "const", "enum", "examples"):
                out[key] = value
            else:
                out[key] = _untitled(value)
        return out
    if isinstance(schema, list):
        return [_untitled(s) for s in schema]
    return schema


def _title(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^0-9A-Za-z]+", name) if part) or "Tool"
