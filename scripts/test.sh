#!/usr/bin/env bash
# Set up .venv with the test extras, then lint, check the architecture and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Layers and no import cycles, declared dependencies, dead code: config in pyproject.toml.
.venv/bin/lint-imports
.venv/bin/deptry .
.venv/bin/vulture
# The documentation site, strictly: a broken link or anchor, a bad docstring or a reference
# without one fails (config in mkdocs.yml; NO_MKDOCS_2_WARNING: no banner of the theme's).
# Not --quiet: it hides the warnings, and --strict then has none to fail on.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict
# The sources' bytecode, written once: the suite starts hundreds of Python processes, and
# where PYTHONDONTWRITEBYTECODE is set each of them would compile every module it imports anew.
.venv/bin/python -m compileall -q fewshot experiments benchmarks tests
# Two workers on two cores: one thread each (two threads each oversubscribe the CPU and take
# about twice as long).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
.venv/bin/python -m pytest -n 2 "$@"
