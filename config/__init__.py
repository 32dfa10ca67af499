"""Team configuration: one TOML file per team, validated once into a typed model."""

from config.model import (
    ConfigError,
    TeamConfig,
    load_team,
    team_file,
)

__all__ = ["ConfigError", "TeamConfig", "load_team", "team_file"]
