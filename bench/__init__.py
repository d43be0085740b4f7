"""The benchmarks: scripts run as files (`python bench/broker_overhead.py`), and the small
modules they share — workload.py, processes.py, clients.py, targets.py, report.py, _stats.py.
They import the product (and `broker.testing`, the broker launcher shared with the tests),
never `tests/`."""
