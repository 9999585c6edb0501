#!/usr/bin/env bash
# Memory and CPU of `lease run` itself (the runner and its watchdog, not the command) at its
# default timings: a leader and a standby of one lease, measured over 60 s after a 5 s start.
# What the Kubernetes recipe's `resources` rest on (docs/performance.md, "Resources").
#
#   cargo build --release -p lease-cli
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bash bench/resources.sh [SECONDS]
set -euo pipefail
lease="${LEASE:-target/release/lease}"
seconds="${1:-60}"
: "${DATABASE_URL:?set DATABASE_URL to a PostgreSQL server}"
name="resources-$$"
"$lease" run "$name" -- sleep 100000 2>/dev/null & leader=$!
sleep 2
"$lease" run "$name" -- sleep 100000 2>/dev/null & standby=$!
sleep 5
# The runner and its descendants but the command (`sleep`).
tree() {
    echo "$1"
    for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
        [ "$(cat /proc/"$c"/comm)" = sleep ] || tree "$c"
    done
}
ticks() { local t=0 p; for p in $(tree "$1"); do set -- $(cut -d' ' -f14,15 /proc/"$p"/stat); t=$((t + $1 + $2)); done; echo $t; }
kib() { local t=0 p; for p in $(tree "$2"); do t=$((t + $(awk -v k="$1:" '$1 == k { print $2 }' /proc/"$p"/status))); done; echo $t; }
l0=$(ticks $leader); s0=$(ticks $standby)
sleep "$seconds"
l1=$(ticks $leader); s1=$(ticks $standby)
hz=$(getconf CLK_TCK)
for who in leader standby; do
    pid=${!who}; t0=l0; t1=l1; [ $who = standby ] && { t0=s0; t1=s1; }
    cpu_ms=$(( (${!t1} - ${!t0}) * 1000 / hz ))
    echo "$who: $(tree $pid | wc -l) processes, RSS $(kib VmRSS $pid) KiB (peak $(kib VmHWM $pid) KiB), CPU ${cpu_ms} ms in ${seconds} s"
done
kill -TERM $leader $standby
wait $leader $standby || true
