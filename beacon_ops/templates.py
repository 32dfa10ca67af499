"""Read synthesized CloudFormation templates and resolve the intrinsics Beacon's use.

The embedded AWS (moto) lacks several resource types, so Beacon provisions what a job touches
straight from the templates. Only the intrinsics that appear there are supported; anything else
is an error that names the resource, never a silent guess.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class TemplateError(Exception):
    """A template holds something the resolver cannot handle."""


@dataclass(frozen=True)
class Template:
    name: str
    body: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> Template:
        return cls(path.name.removesuffix(".template.json"), json.loads(path.read_text()))

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        return dict(self.body.get("Resources", {}))

    def of_type(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.resources.items() if v["Type"] == resource_type}

    def one_of_type(self, resource_type: str, *, logical_id_prefix: str = "") -> tuple[str, dict[str, Any]]:
        matches = {k: v for k, v in self.of_type(resource_type).items() if k.startswith(logical_id_prefix)}
        if len(matches) != 1:
            raise TemplateError(
                f"{self.name}: expected one {resource_type} starting {logical_id_prefix!r}, found {sorted(matches)}"
            )
        return next(iter(matches.items()))


def load_templates(outdir: Path) -> dict[str, Template]:
    return {t.name: t for t in (Template.load(p) for p in sorted(outdir.glob("*.template.json")))}


# Maps a resource's logical id to what Ref / GetAtt return for it once provisioned.
AttributeResolver = Callable[[str, str | None], str]


@dataclass
class Resolver:
    """Resolves Ref, Fn::GetAtt, Fn::Join, Fn::Sub, Fn::Split, Fn::Select and the pseudo parameters."""

    account: str
    region: str
    attributes: AttributeResolver
    imports: Callable[[str], str] = field(default=lambda name: f"<import:{name}>")
    partition: str = "aws"
    url_suffix: str = "amazonaws.com"
    _pseudo: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self._pseudo = {
            "AWS::AccountId": self.account,
            "AWS::Region": self.region,
            "AWS::Partition": self.partition,
            "AWS::URLSuffix": self.url_suffix,
            "AWS::StackName": "beacon-local",
        }

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, Mapping):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Ref":
                return self._pseudo.get(argument) or self.attributes(argument, None)
            if key == "Fn::GetAtt":
                logical_id, attribute = argument if isinstance(argument, list) else argument.split(".", 1)
                return self.attributes(logical_id, attribute)
            if key == "Fn::Join":
                separator, parts = argument
                return separator.join(str(self.resolve(p)) for p in parts)
            if key == "Fn::Sub":
                return self._sub(argument)
            if key == "Fn::Split":  # CDK builds an ECR repository's URI from its ARN's fields
                separator, text = argument
                return str(self.resolve(text)).split(separator)
            if key == "Fn::Select":
                index, values = argument
                return self.resolve(values)[int(index)]
            if key == "Fn::ImportValue":
                return self.imports(str(self.resolve(argument)))
            if key == "Fn::GetStackOutput":  # CDK's cross-stack references
                return self.imports(f"{argument['StackName']}.{argument['OutputName']}")
            if key.startswith("Fn::"):
                raise TemplateError(f"unsupported intrinsic {key}")
        return {k: self.resolve(v) for k, v in value.items()}

    def _sub(self, argument: Any) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else argument
        out, rest = [], text
        while "${" in rest:
            before, _, after = rest.partition("${")
            name, _, rest = after.partition("}")
            out.append(before)
            if name in variables:
                out.append(str(self.resolve(variables[name])))
            elif name in self._pseudo:
                out.append(self._pseudo[name])
            else:
                logical_id, _, attribute = name.partition(".")
                out.append(self.attributes(logical_id, attribute or None))
        out.append(rest)
        return "".join(out)


def marker(logical_id: str, attribute: str | None) -> str:
    """What an unprovisioned resource resolves to when only the template's shape matters."""
    return f"<{logical_id}{'.' + attribute if attribute else ''}>"


def shape_resolver() -> Resolver:
    return Resolver(account="000000000000", region="us-east-1", attributes=marker)


def kubernetes_objects(template: Template) -> dict[str, list[dict[str, Any]]]:
    """The objects of each Custom::AWSCDK-EKS-KubernetesResource, by logical id, tokens as markers."""
    resolver = shape_resolver()
    out = {}
    for logical_id, resource in template.of_type("Custom::AWSCDK-EKS-KubernetesResource").items():
        out[logical_id] = list(json.loads(resolver.resolve(resource["Properties"]["Manifest"])))
    return out
