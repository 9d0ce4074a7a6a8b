#!/bin/sh
# gpulab job runner: PID 1 of a training job's container (mounted read-only by gpulab).
#
# Runs the job's command. A SIGTERM (docker stop: interruption, preemption, time-out) is passed
# on to the command, which may checkpoint during the grace period. When the supervisor detects a
# hang it creates $RESTART_FLAG and kills the command: the runner then runs the same command
# again in the same container, without going back through the queue.
RESTART_FLAG=/tmp/.gpulab-restart
CHILD_PID=/tmp/.gpulab-child
child=0
# the container's stderr stays the command's (fd 3); the shell's own job notices ("Killed")
# go nowhere, so that they never look like the command's output to the hang detector
exec 3>&2 2>/dev/null
forward() { [ "$child" -ne 0 ] && kill -TERM "$child" 2>/dev/null; }
trap forward TERM INT
while :; do
    "$@" 2>&3 &
    child=$!
    echo "$child" > "$CHILD_PID"
    wait "$child"
    code=$?
    # a trapped signal interrupts wait: wait again until the command has really ended
    while kill -0 "$child" 2>/dev/null; do
        wait "$child"
        code=$?
    done
    if [ -e "$RESTART_FLAG" ]; then
        rm -f "$RESTART_FLAG"
        echo "[gpulab] no progress: the command is restarted in place" >&3
        continue
    fi
    exit "$code"
done
