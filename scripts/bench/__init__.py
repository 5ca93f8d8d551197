"""Benchmark-only helpers of scripts/bench_*.py (baselines, the vLLM-like target, probes): nothing of the product
imports them. Importable as `bench` with scripts/ on sys.path (a script's own directory is)."""
