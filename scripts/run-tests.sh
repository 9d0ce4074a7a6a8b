#!/usr/bin/env bash
# The test suite, as `make test` runs it, in two passes that run side by side:
#   1. every test but the swarm lab's, on WORKERS pytest-xdist workers (the tests wait on hubs,
#      containers and Chromium more than they compute: two workers on two cores finished
#      well before one, and three before two (864 s against 956 s, vmstat finding 4 % of the
#      CPU idle instead of 18 %); the modules that share a hub go to one worker, see
#      tests/conftest.py);
#   2. the swarm lab's tests (tests/swarm), in a pytest process of their own beside pass 1:
#      they wait on the lab's nodes most of the time (the load average stays under 1 while
#      they run alone for 11 minutes). The lab makes this host's engine a swarm manager, which
#      leaves its plain containers and bridge networks alone; the interfaces it adds make
#      Chromium abort a page load now and then (ERR_NETWORK_CHANGED), which the browser tests'
#      pages load once more (tests/browser/conftest.py). Its output is kept in
#      artifacts/swarm-pass.log and printed after pass 1's. TEST_OVERLAP=0: after pass 1.
# Each test process draws its servers' ports from a band of its own (tests/support/ports.py).
# Each pass lists its 30 slowest tests' phases (--durations=30: setup, call, teardown), so that
# a CI log says where the time went.
# Both passes run; the exit status is the first pass's failure, else the second's. A pass that
# selects no test (PYTEST_ARGS naming other tests) is not a failure unless neither ran any.
#
# Usage: scripts/run-tests.sh WORKERS [PYTEST ARGS...]   (WORKERS=0: one process, no xdist)
set -uo pipefail
workers=${1:?usage: scripts/run-tests.sh WORKERS [PYTEST ARGS...]}
shift
pytest=${PYTEST:-.venv/bin/pytest}
overlap=${TEST_OVERLAP:-1}
log=artifacts/swarm-pass.log
mkdir -p artifacts

t0=$SECONDS
# every image event of the run (tag, untag, delete, with times), to tell afterwards which test
# or script removed an image that another test still needed
events=artifacts/docker-image-events.log
docker events --filter type=image --format '{{.Time}} {{.Action}} {{.Actor.ID}} {{index .Actor.Attributes "name"}}' >"$events" 2>&1 &
events_pid=$!
trap 'kill "$events_pid" 2>/dev/null || true' EXIT
if [ "$overlap" = 1 ]; then
    # started a few seconds after pass 1, so that pass 1's controller prunes leftover
    # networks before the lab makes its own
    ( sleep 5; "$pytest" -ra --durations=30 -m swarm "$@" >"$log" 2>&1; echo $? >"$log.rc"; echo $((SECONDS - t0)) >"$log.s" ) &
    swarm_pid=$!
fi
"$pytest" -ra --durations=30 -n "$workers" --dist loadgroup -m "not swarm" "$@"
first=$?
t1=$SECONDS
if [ "$overlap" = 1 ]; then
    wait "$swarm_pid"
    echo "=== pass 2 (swarm lab), run beside pass 1: $log"
    cat "$log"
    second=$(cat "$log.rc")
    echo "run-tests: pass 1 (${workers} workers) $((t1 - t0)) s, exit $first; pass 2 (swarm, beside it) $(cat "$log.s") s, exit $second; both $((SECONDS - t0)) s"
else
    "$pytest" -ra --durations=30 -m swarm "$@"
    second=$?
    echo "run-tests: pass 1 (${workers} workers) $((t1 - t0)) s, exit $first; pass 2 (swarm) $((SECONDS - t1)) s, exit $second"
fi

no_tests=5
if [ "$first" != 0 ] && [ "$first" != "$no_tests" ]; then exit "$first"; fi
if [ "$second" != 0 ] && [ "$second" != "$no_tests" ]; then exit "$second"; fi
if [ "$first" = "$no_tests" ] && [ "$second" = "$no_tests" ]; then exit "$no_tests"; fi
exit 0
