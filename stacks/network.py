"""The network stack: VPC, flow logs, endpoints and the training nodes' security group."""

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from beacon_constructs.network import TrainingNetwork
from config import TeamConfig
from stacks import outputs


class NetworkStack(Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, config: TeamConfig, cluster_name: str, **kwargs: object
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)  # type: ignore[arg-type]
        self.network = TrainingNetwork(
            self,
            "Network",
            cidr=config.network.vpc_cidr,
            az_count=config.network.az_count,
            availability_zones=list(config.availability_zones()) if config.account else None,
            extra_endpoints=config.network.extra_endpoints,
            cluster_name=cluster_name,
            flow_log_retention_days=config.monitoring.log_retention_days,
        )
        CfnOutput(self, outputs.VPC_ID, value=self.network.vpc.vpc_id)
