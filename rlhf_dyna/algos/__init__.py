"""Advantage estimators, policy / value losses, KL penalties and controllers: pure tensor functions (import the
modules: the package imports nothing, so that `choices` is readable without torch)."""
