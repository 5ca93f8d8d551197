"""Tests of the benchmark helpers under scripts/bench/ (importable as `bench`: scripts/ goes onto sys.path)."""
import sys
from pathlib import Path

SCRIPTS = str(Path(__file__).resolve().parents[2] / "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)
