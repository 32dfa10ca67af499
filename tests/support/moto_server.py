"""Tests use the same embedded AWS as `beacon local`: a real moto server on loopback."""

from beacon_ops.local.moto import ACCOUNT, REGION, EmbeddedAws

MotoServer = EmbeddedAws

__all__ = ["ACCOUNT", "REGION", "MotoServer"]
