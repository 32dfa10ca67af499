"""The example team file carries every key of the model, with its default, and stays valid (issue 12, item 5)."""

from __future__ import annotations

import tomllib

from pydantic import BaseModel

from config import TeamConfig, load_team
from config.model import TEAMS_DIR


def keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    found = set()
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found |= keys(field.annotation, f"{prefix}{name}.")
        else:
            found.add(f"{prefix}{name}")
    return found


def test_the_example_team_file_loads() -> None:
    config = load_team("example")
    assert config.account and config.monitoring.alarm_email


def test_the_example_names_every_key_of_the_model() -> None:
    raw = tomllib.loads((TEAMS_DIR / "example.toml").read_text())
    written = {f"{section}.{key}" for section, body in raw.items() if isinstance(body, dict) for key in body}
    written |= {key for key, value in raw.items() if not isinstance(value, dict)}
    assert written == keys(TeamConfig)


def test_the_example_shows_the_defaults_of_the_standard_profile() -> None:
    example = load_team("example")
    assert example.profile == "standard"
    for section in ("network", "cluster", "compute", "artifacts", "images", "training"):
        value = getattr(example, section)
        assert value == type(value)(), section
    defaults = type(example.monitoring)().model_dump(exclude={"alarm_email"})
    assert example.monitoring.model_dump(exclude={"alarm_email"}) == defaults
