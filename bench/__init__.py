"""The benchmarks: scripts run as files (`python bench/broker_overhead.py`), and the small
modules they share — workload.py, processes.py, clients.py, targets.py, overhead_table.py,
_stats.py — and reportgen/, the parts of make_report.py (which writes REPORT.md).
They import the product (and `broker.testing`, the broker launcher shared with the tests),
never `tests/`."""
