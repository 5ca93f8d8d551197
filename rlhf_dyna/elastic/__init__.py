"""Elastic device manager: placements per phase (placement, policies, validate, simulate: pure, vps only)
and the world builder that creates their process groups in the background (live)."""
