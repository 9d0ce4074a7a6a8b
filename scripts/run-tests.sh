#!/usr/bin/env bash
# The test suite, as `make test` runs it, in two passes:
#   1. every test but the swarm lab's, on WORKERS pytest-xdist workers (the tests wait on hubs,
#      containers and Chromium more than they compute: two workers on two cores finish well
#      before one; the modules that share a hub go to one worker, see tests/conftest.py);
#   2. the swarm lab's tests (tests/swarm) alone: the lab makes this host's engine a swarm
#      manager, so nothing else may run beside them.
# Both passes run; the exit status is the first pass's failure, else the second's. A pass that
# selects no test (PYTEST_ARGS naming other tests) is not a failure unless neither ran any.
#
# Usage: scripts/run-tests.sh WORKERS [PYTEST ARGS...]   (WORKERS=0: one process, no xdist)
set -uo pipefail
workers=${1:?usage: scripts/run-tests.sh WORKERS [PYTEST ARGS...]}
shift
pytest=${PYTEST:-.venv/bin/pytest}

t0=$SECONDS
"$pytest" -ra -n "$workers" --dist loadgroup -m "not swarm" "$@"
first=$?
t1=$SECONDS
"$pytest" -ra -m swarm "$@"
second=$?
echo "run-tests: pass 1 (${workers} workers) $((t1 - t0)) s, exit $first; pass 2 (swarm) $((SECONDS - t1)) s, exit $second"

no_tests=5
if [ "$first" != 0 ] && [ "$first" != "$no_tests" ]; then exit "$first"; fi
if [ "$second" != 0 ] && [ "$second" != "$no_tests" ]; then exit "$second"; fi
if [ "$first" = "$no_tests" ] && [ "$second" = "$no_tests" ]; then exit "$no_tests"; fi
exit 0
