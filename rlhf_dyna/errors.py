"""The error of a config that cannot run: every pre-spawn check raises it (rlhf_dyna/checks), and so do the
modules below the checks that find a bad value first (rewards, checkpoint fields)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot run: one paragraph that says what is wrong and what would be right."""
