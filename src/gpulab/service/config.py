"""The service reads the hub's own configuration file, so settings are written once."""

from __future__ import annotations

from pathlib import Path

from traitlets.config import Config, PyFileConfigLoader


def load_config(path: str | None) -> Config:
    if not path:
        return Config()
    p = Path(path)
    return PyFileConfigLoader(p.name, path=str(p.parent)).load_config()
