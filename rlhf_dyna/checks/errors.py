"""The error every pre-spawn check raises."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot run: one paragraph that says what is wrong and what would be right."""
