"""The adversarial suite: chaos fan-out, named races, bad runner output, process-level checks."""
