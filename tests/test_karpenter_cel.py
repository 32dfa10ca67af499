"""Every NodePool and EC2NodeClass the stack renders passes the Karpenter CRDs' CEL rules and
structural schema, as the API server would check them (tests/support/karpenter_crds.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from beacon_constructs import karpenter_manifests as km
from beacon_ops.templates import kubernetes_objects
from tests.support.karpenter_crds import compile_all, validate
from tests.support.synth import Synthesized

NODE_POOL, NODE_CLASS = ("karpenter.sh/v1", "NodePool"), ("karpenter.k8s.aws/v1", "EC2NodeClass")
# Rules not evaluated, with the reason. None today: every rule compiles with cel-python plus the two
# Kubernetes functions the CRDs use (find, split); the three transition rules (oldSelf) are evaluated
# as a re-apply of the same object, since the API server skips them on create.
SKIPPED_RULES: dict[str, str] = {}


@pytest.fixture(scope="module")
def karpenter_objects(demo: Synthesized) -> list[dict[str, Any]]:
    objects = [o for group in kubernetes_objects(demo.template("cluster")).values() for o in group]
    return [o for o in objects if o["apiVersion"].startswith("karpenter")]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return copy.deepcopy(found)


def test_every_cel_rule_of_both_crds_compiles() -> None:
    pool_rules, class_rules = compile_all(*NODE_POOL), compile_all(*NODE_CLASS)
    assert len(pool_rules) == 20 and len(class_rules) == 44, "the CRDs changed: review SKIPPED_RULES"
    transition = sorted(r.rule for r in pool_rules + class_rules if r.is_transition)
    assert transition == [
        "has(self.replicas) == has(oldSelf.replicas)",
        "self.group == oldSelf.group",
        "self.kind == oldSelf.kind",
    ]
    assert set(SKIPPED_RULES) <= {r.rule for r in pool_rules + class_rules}, "a skipped rule no longer exists"


def test_every_rendered_node_pool_and_node_class_is_admitted(karpenter_objects: list[dict[str, Any]]) -> None:
    assert sorted((o["kind"], o["metadata"]["name"]) for o in karpenter_objects) == [
        ("EC2NodeClass", "cpu"),
        ("EC2NodeClass", "gpu"),
        ("NodePool", "cpu-smoke"),
        ("NodePool", "gpu-training"),
    ]
    for obj in karpenter_objects:
        assert validate(obj) == [], (obj["kind"], obj["metadata"]["name"])


def test_a_node_pool_requiring_a_restricted_label_is_rejected_by_a_cel_rule(
    karpenter_objects: list[dict[str, Any]],
) -> None:
    """Proves the evaluator runs: the schema alone admits this object, one CEL rule refuses it."""
    pool = one(karpenter_objects, "NodePool", "gpu-training")
    pool["spec"]["template"]["spec"]["requirements"].append(
        {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu-training"]}
    )
    messages = {f.message for f in validate(pool)}
    assert 'label "karpenter.sh/nodepool" is restricted' in messages


def test_a_requirement_in_without_values_is_rejected(karpenter_objects: list[dict[str, Any]]) -> None:
    pool = one(karpenter_objects, "NodePool", "cpu-smoke")
    pool["spec"]["template"]["spec"]["requirements"].append(
        {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": []}
    )
    assert "requirements with operator 'In' must have a value defined" in {f.message for f in validate(pool)}


def test_a_node_class_with_an_unsupported_ami_family_is_rejected(karpenter_objects: list[dict[str, Any]]) -> None:
    node_class = one(karpenter_objects, "EC2NodeClass", "gpu")
    node_class["spec"]["amiSelectorTerms"] = [{"alias": "ubuntu@v20260101"}]
    (finding,) = validate(node_class)
    assert finding.path == ".spec.amiSelectorTerms[0].alias"
    assert finding.message.startswith("family is not supported")


def test_a_node_class_with_both_role_and_instance_profile_is_rejected(
    karpenter_objects: list[dict[str, Any]],
) -> None:
    node_class = one(karpenter_objects, "EC2NodeClass", "cpu")
    node_class["spec"]["instanceProfile"] = "some-profile"
    assert "must specify exactly one of ['role', 'instanceProfile']" in {f.message for f in validate(node_class)}


def test_an_unknown_field_is_rejected_as_strict_field_validation_would(
    karpenter_objects: list[dict[str, Any]],
) -> None:
    pool = one(karpenter_objects, "NodePool", "gpu-training")
    pool["spec"]["template"]["spec"]["taint"] = pool["spec"]["template"]["spec"].pop("taints")  # a typo
    assert [str(f) for f in validate(pool)] == [".spec.template.spec.taint: unknown field"]


def test_pools_built_from_other_team_settings_are_admitted_too() -> None:
    """The builders' other branches (explicit instance types, one capacity type, no GPU quota)."""
    gpu = km.gpu_training_pool(
        instance_families=["p5"],
        instance_types=["p5.48xlarge"],
        capacity_types=["on-demand"],
        gpu_limit=0,
        cpu_limit=192,
    )
    cpu = km.cpu_smoke_pool(capacity_types=["spot"], cpu_limit=8)
    node_class = km.node_class(km.NodeClassSpec("gpu", "beacon-ml", "beacon-ml-node", 500, "ml", "al2023@v20260818"))
    for obj in (gpu, cpu, node_class):
        assert validate(obj) == [], obj["metadata"]["name"]
