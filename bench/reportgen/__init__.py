"""The parts of `bench/make_report.py`: the machine's header, running a bench, each section, plots.

Each section runs one bench (or reads one earlier run's files) as a child process that writes its
figures with `--json`, turns them into a typed result, renders markdown and draws a plot. What
cannot be measured (a bench missing from this tree, no Docker daemon, no lab) becomes one
"not measured: <why>" line in the report, never a crash of the whole run.
"""
