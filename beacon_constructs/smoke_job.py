"""The bundled smoke-training Job: the image built from runtime/ (the library and its smoke job), one Job per deploy."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct, IDependable

from beacon_constructs.tagging import tag_component
from workloads import manifests

IMAGE_DIR = Path(__file__).resolve().parent.parent / "runtime"


class SmokeJob(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        spec: manifests.SmokeJobSpec,
        platform: str,
        after: list[IDependable],
    ) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "smoke-job")
        # Synth only stages the directory; Docker is needed at deploy time, not here.
        self.image = ecr_assets.DockerImageAsset(
            self,
            "Image",
            directory=str(IMAGE_DIR),
            platform=ecr_assets.Platform.custom(platform),
            exclude=["__pycache__", "**/__pycache__", "*.pyc", "build", "*.egg-info"],
        )
        # The name hashes the image and the settings: a changed deploy runs a fresh Job.
        self.spec = dataclasses.replace(spec, image=self.image.image_uri, name_suffix=f"-{self.image.asset_hash[:6]}")
        self.objects = manifests.smoke_job(self.spec)
        self.manifest = cluster.add_manifest("Job", *self.objects)
        self.manifest.node.add_dependency(*after)
