"""inferq benchmark harness: ``python -m bench run --config bench/configs/cpu-small.json``."""
