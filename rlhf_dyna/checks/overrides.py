"""Early check of command-line overrides against the typed config, with suggestions.

Hydra refuses unknown keys too, but only after composing; this says which key is wrong,
what it probably meant, and which keys exist, in one paragraph.
"""
from __future__ import annotations

import dataclasses
import difflib
from importlib import resources

from ..config import Config
from ..errors import ConfigError

# the config groups under conf/: the Config fields that have a folder of options there, and the recipes
GROUPS = tuple(sorted(f.name for f in dataclasses.fields(Config)
                      if resources.files("rlhf_dyna.conf").joinpath(f.name).is_dir()))


def group_options(group: str) -> list[str]:
    folder = resources.files("rlhf_dyna.conf").joinpath(group)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _fields(cls) -> dict[str, object]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _field_type(cls, name: str):
    default = _fields(cls)[name].default_factory  # type: ignore[union-attr]
    return type(default()) if default is not dataclasses.MISSING else None


def check_key(key: str) -> None:
    cls, walked = Config, []
    for part in key.split("."):
        fields = _fields(cls)
        if part not in fields:
            where = ".".join(walked) or "the top level"
            close = difflib.get_close_matches(part, fields, n=1)
            hint = f" Did you mean '{'.'.join(walked + close)}'?" if close else ""
            raise ConfigError(
                f"Unknown config key '{key}': '{part}' is not a key of {where}.{hint} "
                f"Valid keys there: {', '.join(sorted(fields))}."
            )
        walked.append(part)
        nested = _field_type(cls, part)
        if nested is None or not dataclasses.is_dataclass(nested):
            return
        cls = nested


def check_overrides(argv: list[str]) -> None:
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        if key.startswith(("hydra.", "+", "~", "++")) or key == "hydra":
            continue
        if key in GROUPS:
            options = group_options(key)
            for choice in value.split(","):
                if choice not in options:
                    close = difflib.get_close_matches(choice, options, n=1)
                    hint = f" Did you mean '{close[0]}'?" if close else ""
                    raise ConfigError(f"Unknown {key} '{choice}'.{hint} Available {key}s: {', '.join(options)}.")
            continue
        check_key(key)
