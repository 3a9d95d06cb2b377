"""The GPU smoke check: every GPU-only path of the project run once, briefly
(``bash benchmarks/gpu_smoke.sh``)."""
