#!/bin/sh
# tw-leave-behind.sh PIDFILE THEN -- an exec-mode agent that leaves processes behind, for the tests of
# "programs end with their step" (tests/test_procs.c). It reads its step document, then starts
#   a child that stays in its process group (a sleep in the background), and
#   a grandchild in a session of its own (setsid, started by a subshell that ends at once, so that it is
#   orphaned while the agent still runs),
# appends their pids to PIDFILE ("group PID", "setsid PID"), and then, as THEN says, replies done ("done") or
# sleeps until it is stopped ("hang": a timeout or a cancel ends its step). In serve mode it reads one request
# line, then does the same (a serve process that never answers is stopped at the step's time limit).
pidfile=$1
if [ "$TURNWATCH_MODE" = serve ]; then
    read -r request
else
    cat >/dev/null
fi
before=$(cat "$pidfile" 2>/dev/null | wc -l)
sleep 300 </dev/null >/dev/null 2>&1 &
echo "group $!" >>"$pidfile"
(setsid sh -c 'echo "setsid $$" >>"$1"; exec sleep 300' sh "$pidfile" </dev/null >/dev/null 2>&1 &)
n=0
while [ "$(wc -l <"$pidfile")" -lt $((before + 2)) ] && [ $n -lt 400 ]; do
    sleep 0.05
    n=$((n + 1))
done
if [ "$2" = hang ]; then
    exec sleep 300
fi
echo '{"complete":{"output":{"left_behind":2}}}'
