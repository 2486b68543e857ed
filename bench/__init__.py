"""Benchmarks and the scripts behind the numbers in README.md and docs/.

Each runs from the checkout as `python -m bench.NAME` or as `python bench/NAME.py` (the form the
results files record); tests import them as `bench.NAME`. No name here is also the name of a
product package or module (`horizonrl.learner`, `horizonrl.envpool`, ...), so nothing on the
path of a script or test can stand in for the other.
"""
