"""Validate Karpenter objects as the API server would: structural pruning (an unknown field is an
error, as with `kubectl apply --validate=strict`), schema defaults, then every CEL rule
(`x-kubernetes-validations`) of the CRD, evaluated with cel-python.

The CRDs are the vendored copies in tests/reference/karpenter-<version>/ (see its README).
Kubernetes adds CEL libraries a plain CEL lacks; the two the Karpenter CRDs use are here
(`find` from the regex library, `split` from the strings extension). Transition rules (those that
read `oldSelf`) are skipped by the API server on create; here they are evaluated as a re-apply of
the same object (oldSelf = self), which is what every later `cdk deploy` of an unchanged manifest is.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from beacon_constructs.karpenter import CHART_VERSION

CRD_DIR = Path(__file__).parent.parent / "reference" / f"karpenter-{CHART_VERSION}"
CRD_FILES = {
    ("karpenter.sh/v1", "NodePool"): "karpenter.sh_nodepools.yaml",
    ("karpenter.k8s.aws/v1", "EC2NodeClass"): "karpenter.k8s.aws_ec2nodeclasses.yaml",
}
# ObjectMeta fields a manifest may set; the API server validates metadata itself, not the CRD.
OBJECT_META = {"name", "namespace", "labels", "annotations", "finalizers", "ownerReferences", "generateName"}


def _find(text: celtypes.StringType, pattern: celtypes.StringType) -> celtypes.StringType:
    """Kubernetes regex library: the first match of `pattern` in the string, or ''."""
    match = re.search(str(pattern), str(text))
    return celtypes.StringType(match.group(0) if match else "")


def _split(text: celtypes.StringType, separator: celtypes.StringType) -> celtypes.ListType:
    """Kubernetes strings extension (cel-go ext.Strings): split on every occurrence."""
    return celtypes.ListType([celtypes.StringType(part) for part in str(text).split(str(separator))])


KUBERNETES_FUNCTIONS: dict[str, Any] = {"find": _find, "split": _split}


@dataclass(frozen=True)
class Rule:
    path: str  # where the rule sits, e.g. `.spec.template.spec.requirements`
    rule: str
    message: str

    @property
    def is_transition(self) -> bool:
        return "oldSelf" in self.rule


@dataclass(frozen=True)
class Finding:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@functools.cache
def schema_for(api_version: str, kind: str) -> dict[str, Any]:
    group, version = api_version.split("/")
    crd = yaml.safe_load((CRD_DIR / CRD_FILES[(api_version, kind)]).read_text())
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]
    return schema


def rules_in(schema: dict[str, Any], path: str = "") -> Iterator[Rule]:
    """Every CEL rule of a schema, with the path of the node it applies to."""
    for validation in schema.get("x-kubernetes-validations", []):
        yield Rule(path or ".", validation["rule"], validation.get("message", validation["rule"]))
    for name, child in schema.get("properties", {}).items():
        yield from rules_in(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from rules_in(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from rules_in(schema["additionalProperties"], f"{path}{{}}")


@functools.cache
def _program(rule: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule), functions=KUBERNETES_FUNCTIONS)


def compile_all(api_version: str, kind: str) -> list[Rule]:
    """Compiles every rule of the CRD (a rule cel-python cannot parse fails here, loudly)."""
    rules = list(rules_in(schema_for(api_version, kind)))
    for rule in rules:
        _program(rule.rule)
    return rules


def with_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """The object after the API server's structural defaulting."""
    if isinstance(value, dict):
        out = dict(value)
        properties = schema.get("properties", {})
        for name, child in properties.items():
            if name not in out and "default" in child:
                out[name] = copy.deepcopy(child["default"])
        for name, item in out.items():
            child = properties.get(name) or (
                schema["additionalProperties"] if isinstance(schema.get("additionalProperties"), dict) else None
            )
            if child is not None:
                out[name] = with_defaults(item, child)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [with_defaults(item, schema["items"]) for item in value]
    return value


def unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> Iterator[Finding]:
    """What structural pruning would drop: with strict field validation the API server refuses it."""
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        for name, item in value.items():
            if name in properties:
                yield from unknown_fields(item, properties[name], f"{path}.{name}")
            elif isinstance(additional, dict):
                yield from unknown_fields(item, additional, f"{path}.{name}")
            elif not (preserve or additional is True):
                yield Finding(f"{path}.{name}", "unknown field")
        for name in schema.get("required", []):
            if name not in value:
                yield Finding(f"{path}.{name}", "Required value")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from unknown_fields(item, schema["items"], f"{path}[{index}]")


def _values_at(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """The values a rule at `path` applies to (one per list element or map value on the way)."""
    if path == ".":
        yield ".", value
        return
    found: list[tuple[str, Any]] = [("", value)]
    for part in re.findall(r"\.[^.\[{]+|\[\]|\{\}", path):
        following: list[tuple[str, Any]] = []
        for where, current in found:
            if part == "[]" and isinstance(current, list):
                following += [(f"{where}[{i}]", item) for i, item in enumerate(current)]
            elif part == "{}" and isinstance(current, dict):
                following += [(f"{where}.{k}", item) for k, item in current.items()]
            elif part.startswith(".") and isinstance(current, dict) and part[1:] in current:
                following.append((f"{where}{part}", current[part[1:]]))
        found = following
    yield from found


def cel_violations(obj: dict[str, Any], rules: list[Rule]) -> Iterator[Finding]:
    for rule in rules:
        for where, value in _values_at(obj, rule.path):
            bound = json_to_cel(value)
            activation = {"self": bound, "oldSelf": bound} if rule.is_transition else {"self": bound}
            try:
                result = _program(rule.rule).evaluate(activation)
            except CELEvalError as error:
                yield Finding(where or ".", f"{rule.message} (evaluation error: {error})")
                continue
            if isinstance(result, CELEvalError):
                yield Finding(where or ".", f"{rule.message} (evaluation error: {result})")
            elif not (isinstance(result, celtypes.BoolType) and bool(result)):
                yield Finding(where or ".", rule.message)


def validate(obj: dict[str, Any]) -> list[Finding]:
    """Every reason the API server would refuse `obj` (empty: it would be admitted)."""
    schema = schema_for(obj["apiVersion"], obj["kind"])
    findings = [Finding(f".metadata.{k}", "unknown field") for k in obj.get("metadata", {}) if k not in OBJECT_META]
    without_metadata = {k: v for k, v in obj.items() if k != "metadata"}
    root = {**schema, "properties": {k: v for k, v in schema["properties"].items() if k != "metadata"}}
    findings += unknown_fields(without_metadata, root)
    if findings:
        return findings
    defaulted = with_defaults(obj, schema)
    return list(cel_violations(defaulted, compile_all(obj["apiVersion"], obj["kind"])))
