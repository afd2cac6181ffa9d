"""Render the chart's templates without the helm binary: the small part of Helm's template language the chart
uses, and nothing else (anything else is an error, so a template that grows past it fails here first).

Supported: `{{ .Values.a.b }}`, `.Release.Name`, `.Release.Namespace`, `.Chart.Version`, `.Chart.AppVersion`;
pipes into `quote`, `toYaml`, `nindent N`, `indent N` (and the call forms `toYaml X`, `quote X`);
`{{- if X }}` / `{{- if not X }}` / `{{- else }}` / `{{- end }}` on a value's truth (Go's: empty, zero,
false and nil are false); `{{-` and `-}}` trim the whitespace before and after; `{{/* comments */}}`.
Values render as Go's text/template prints them (booleans lowercase, whole floats without ".0").

Why not helm itself: the registries the project may use ship no helm binary; the chart is small and kept to
this subset, and the rendered manifests are validated against the Kubernetes API's own models (the
`kubernetes` client) by tests/k8s/test_manifests.py, so what helm would produce is checked by
meaning, not by bytes. `deploy/kubernetes/perseusd.yaml` is this renderer's output for the default values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ACTION = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.DOTALL)


class TemplateError(ValueError):
    """A template uses something outside the supported subset, or names a missing value."""


@dataclass
class _Node:
    kind: str  # "text", "expr", "if"
    text: str = ""
    negate: bool = False
    body: list[_Node] = field(default_factory=list)
    other: list[_Node] = field(default_factory=list)


def _tokens(source: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", s) pieces, with the trim markers applied."""
    pieces: list[tuple[str, str]] = []
    pos = 0
    for match in ACTION.finditer(source):
        text = source[pos : match.start()]
        if match.group(1):
            text = text.rstrip()
        pieces.append(("text", text))
        pieces.append(("action", match.group(2)))
        pos = match.end()
        if match.group(3):
            rest = source[pos:]
            pos += len(rest) - len(rest.lstrip())
    pieces.append(("text", source[pos:]))
    return pieces


def _parse(pieces: list[tuple[str, str]]) -> list[_Node]:
    root: list[_Node] = []
    stack: list[tuple[_Node, bool]] = []  # (if node, in its else branch)

    def target() -> list[_Node]:
        if not stack:
            return root
        node, in_else = stack[-1]
        return node.other if in_else else node.body

    for kind, text in pieces:
        if kind == "text":
            target().append(_Node("text", text))
        elif text.startswith("/*"):
            continue
        elif text.startswith("if "):
            condition = text[3:].strip()
            negate = condition.startswith("not ")
            node = _Node("if", condition[4:].strip() if negate else condition, negate)
            target().append(node)
            stack.append((node, False))
        elif text == "else":
            if not stack or stack[-1][1]:
                raise TemplateError("else without if")
            stack[-1] = (stack[-1][0], True)
        elif text == "end":
            if not stack:
                raise TemplateError("end without if")
            stack.pop()
        else:
            target().append(_Node("expr", text))
    if stack:
        raise TemplateError("if without end")
    return root


def _lookup(path: str, scope: Mapping[str, Any]) -> Any:
    if not path.startswith("."):
        raise TemplateError(f"unsupported expression {path!r}")
    value: Any = scope
    for part in path[1:].split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise TemplateError(f"{path}: no such value")
        value = value[part]
    return value


def _go_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<no value>"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _to_yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")


def _evaluate(expression: str, scope: Mapping[str, Any]) -> str:
    stages = [stage.strip() for stage in expression.split("|")]
    first, _, argument = stages[0].partition(" ")
    if first in ("toYaml", "quote"):  # the call form: `toYaml .Values.x | nindent 8`
        stages[0:1] = [argument.strip(), first]
    value: Any = _lookup(stages[0], scope)
    as_text: str | None = None
    for stage in stages[1:]:
        name, _, argument = stage.partition(" ")
        if name == "quote":
            as_text = '"' + _go_text(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        elif name == "toYaml":
            as_text = _to_yaml(value)
        elif name in ("nindent", "indent") and argument.strip().isdigit():
            pad = " " * int(argument)
            text = as_text if as_text is not None else _go_text(value)
            indented = "\n".join(pad + line if line else line for line in text.split("\n"))
            as_text = ("\n" if name == "nindent" else "") + indented
        else:
            raise TemplateError(f"unsupported function {stage!r}")
    return as_text if as_text is not None else _go_text(value)


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, 0.0, "") and not (isinstance(value, list | dict) and not value)


def _render_nodes(nodes: list[_Node], scope: Mapping[str, Any]) -> str:
    out = []
    for node in nodes:
        if node.kind == "text":
            out.append(node.text)
        elif node.kind == "expr":
            out.append(_evaluate(node.text, scope))
        else:
            holds = _truthy(_lookup(node.text, scope)) != node.negate
            out.append(_render_nodes(node.body if holds else node.other, scope))
    return "".join(out)


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Values with `overrides` merged in (maps recursively, like helm's --set and -f)."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def render_chart(
    chart: Path,
    overrides: Mapping[str, Any] | None = None,
    release: str = "perseusd",
    namespace: str = "perseus-system",
) -> str:
    """Every template of `chart` rendered with its values (and `overrides`), as one YAML stream."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    values = merge(yaml.safe_load((chart / "values.yaml").read_text()), overrides or {})
    scope = {
        "Values": values,
        "Release": {"Name": release, "Namespace": namespace},
        "Chart": {"Version": meta["version"], "AppVersion": meta["appVersion"]},
    }
    documents = []
    for template in sorted((chart / "templates").glob("*.yaml")):
        rendered = _render_nodes(_parse(_tokens(template.read_text())), scope).strip()
        body = "\n".join(line for line in rendered.splitlines() if not line.lstrip().startswith("#"))
        if body.strip():
            documents.append(f"# Source: perseusd/templates/{template.name}\n{rendered}\n")
    return "---\n".join(documents)


REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "deploy" / "helm" / "perseusd"
PLAIN_MANIFEST = REPO_ROOT / "deploy" / "kubernetes" / "perseusd.yaml"
PLAIN_HEADER = (
    "# perseusd for `kubectl apply -f` (namespace perseus-system: create it first), without Helm.\n"
    "# Generated from the chart deploy/helm/perseusd with its default values by\n"
    "# `python tests/k8s/helm_render.py`: edit the chart, not this file.\n"
)


def plain_manifest() -> str:
    return PLAIN_HEADER + render_chart(CHART)


if __name__ == "__main__":
    PLAIN_MANIFEST.write_text(plain_manifest())
    print(f"wrote {PLAIN_MANIFEST}")
