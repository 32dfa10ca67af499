"""Who may take a role through EKS Pod Identity: one cluster's pods of one service account in one namespace.

The Pod Identity agent assumes a role as `pods.eks.amazonaws.com` with session tags naming the pod's cluster
(its ARN), namespace and service account. A role that trusts the service alone trusts any association in the
account: whoever may create one on another cluster, and pass the role, gets it. So every role a pod takes
here trusts the service only with the three tags it was made for (the EKS user guide's own example).
"""

from __future__ import annotations

from typing import Any, cast

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from constructs import IConstruct

POD_IDENTITY_SERVICE = "pods.eks.amazonaws.com"
POD_IDENTITY_ACTIONS = ("sts:AssumeRole", "sts:TagSession")


def cluster_arn(scope: IConstruct, cluster_name: str) -> str:
    return Stack.of(scope).format_arn(service="eks", resource="cluster", resource_name=cluster_name)


def pod_identity_conditions(
    scope: IConstruct, *, cluster_name: str, namespace: str, service_account: str
) -> dict[str, Any]:
    return {
        "StringEquals": {
            "aws:RequestTag/eks-cluster-arn": cluster_arn(scope, cluster_name),
            "aws:RequestTag/kubernetes-namespace": namespace,
            "aws:RequestTag/kubernetes-service-account": service_account,
        }
    }


def pod_identity_principal(
    scope: IConstruct, *, cluster_name: str, namespace: str, service_account: str
) -> iam.IPrincipal:
    """For a role made here: `iam.Role(assumed_by=...)`."""
    conditions = pod_identity_conditions(
        scope, cluster_name=cluster_name, namespace=namespace, service_account=service_account
    )
    return iam.ServicePrincipal(POD_IDENTITY_SERVICE).with_session_tags().with_conditions(conditions)


def pod_identity_statement(
    scope: IConstruct, *, cluster_name: str, namespace: str, service_account: str
) -> iam.PolicyStatement:
    """For a role's trust policy with other principals beside (the writer, which SageMaker takes too)."""
    return iam.PolicyStatement(
        actions=list(POD_IDENTITY_ACTIONS),
        principals=[iam.ServicePrincipal(POD_IDENTITY_SERVICE)],
        conditions=pod_identity_conditions(
            scope, cluster_name=cluster_name, namespace=namespace, service_account=service_account
        ),
    )


def scope_pod_identity_trust(role: iam.IRole, *, cluster_name: str, namespace: str, service_account: str) -> None:
    """For a role another construct made trusting the service alone (`Cluster.add_service_account`): its trust
    policy replaced by the scoped one."""
    document = iam.PolicyDocument(
        statements=[
            pod_identity_statement(
                role, cluster_name=cluster_name, namespace=namespace, service_account=service_account
            )
        ]
    )
    cast(iam.CfnRole, role.node.default_child).assume_role_policy_document = document
