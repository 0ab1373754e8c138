"""One router per resource: sweeps, results, configs, workers."""
