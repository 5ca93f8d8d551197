"""Checks of a composed config that run before any rank is spawned, one module per concern."""
