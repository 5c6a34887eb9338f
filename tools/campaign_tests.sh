#!/usr/bin/env bash
# The tests kept out of the suite for time (marked `campaign`): multi-node Ray soaks, killed Ray actors and
# drivers (the suite kills process workers), Ray's policy-driven and suite jobs, the slow-writer memory bound,
# the short crash and power-cut campaigns and the other kills at random moments (depth jobs, LeRobot's writer:
# the suite kills at events), every MT50 task's expert, and the per-robot train -> evaluate loops
# (ALOHA insertion, SO-101, rerendered Meta-World).
# Run from the repository root after tools/setup.sh; extra arguments go to pytest (e.g. -k so101).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile -m campaign "$@"
