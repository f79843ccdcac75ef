"""The benchmarks, run as modules from the repository root (`python -m benchmarks.relay`), so that
they import the test helpers that start and stop the real processes as `tests.helpers.*`."""
