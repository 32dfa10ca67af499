"""The two tags every Beacon resource carries."""

from aws_cdk import Tags
from constructs import IConstruct

TEAM_TAG = "beacon:team"
COMPONENT_TAG = "beacon:component"


def tag_component(scope: IConstruct, component: str) -> None:
    Tags.of(scope).add(COMPONENT_TAG, component)


def tag_team(scope: IConstruct, team: str) -> None:
    Tags.of(scope).add(TEAM_TAG, team)
