#!/usr/bin/env python3
"""Schedules of `lease run --every`, against a real server: how late a due time starts.

  steady    one replica, `--every 1s`, for --seconds: due time -> the command's own first
            line (its `date`), p50/p99/max; without and with `--state-table`
  kill9     two replicas, `--every 2s --state-table T --catch-up-policy all`, the leader
            SIGKILLed 10 ms before a due time, --rounds times: due time -> that due time's
            start on the standby (caught up from the table)

Usage (from the repository root, after `cargo build -p lease-cli`; the table is created
with `lease schedule init` if absent):

  python3 bench/schedule-latency.py --lease target/debug/lease \
      --url 'host=127.0.0.1 port=5432 user=postgres dbname=postgres' steady kill9

Python 3 standard library only. Times come from the host's clock, which is the server's
when both run on one host (as here); on two hosts, the difference of their clocks adds in.
"""

import argparse
import datetime
import os
import signal
import subprocess
import sys
import tempfile
import time


def due_of(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def spawn(args, name, extra, out):
    script = f'echo "$LEASE_DUE $(date +%s.%N)" >> {out}'
    cmd = [args.lease, "run", "--database-url", args.url, "-q", *extra, name,
           "--", "sh", "-c", script]
    return subprocess.Popen(cmd, stderr=subprocess.DEVNULL, start_new_session=True)


def runs(out):
    try:
        with open(out) as f:
            return [(due_of(d), float(t)) for d, t in (line.split() for line in f)]
    except FileNotFoundError:
        return []


def quantiles(ms):
    ms = sorted(ms)
    q = lambda f: ms[min(len(ms) - 1, int(len(ms) * f))]
    return f"p50 {q(0.5):.1f} ms, p99 {q(0.99):.1f} ms, max {ms[-1]:.1f} ms ({len(ms)} runs)"


def steady(args, tmp):
    for mode, extra in (("without a table", []), ("with --state-table", ["--state-table", args.table])):
        out = os.path.join(tmp, f"steady-{len(extra)}")
        p = spawn(args, f"bench-steady-{os.getpid()}-{len(extra)}", ["--every", "1s", *extra], out)
        time.sleep(args.seconds)
        p.send_signal(signal.SIGTERM)
        p.wait()
        lat = [(t - d) * 1000 for d, t in runs(out)]
        print(f"steady {mode}: due time -> command start {quantiles(lat)}")


def kill9(args, tmp):
    out = os.path.join(tmp, "kill9")
    name = f"bench-kill9-{os.getpid()}"
    extra = ["--every", "2s", "--state-table", args.table, "--catch-up-policy", "all",
             "--retry-interval", "200ms", "--heartbeat-interval", "100ms", "--query-timeout", "1s"]
    replicas = [spawn(args, name, extra, out) for _ in range(2)]
    lat = []
    time.sleep(3)
    for _ in range(args.rounds):
        before = len(runs(out))
        # The leader: the replica whose command ran last is not known from outside;
        # kill the one holding the lease as `lease status` shows it would need parsing,
        # so kill both in turn: the one that leads is the one whose death stops the runs.
        now = time.time()
        due = (int(now / 2) + 2) * 2
        time.sleep(max(0, due - 0.010 - time.time()))
        leader = find_leader(args, name, replicas)
        leader.send_signal(signal.SIGKILL)
        leader.wait()
        replicas.remove(leader)
        replicas.append(spawn(args, name, extra, out))
        time.sleep(3)
        starts = [t for d, t in runs(out)[before:] if d == due]
        if len(starts) != 1:
            print(f"kill9: due {due} started {len(starts)} times", file=sys.stderr)
            continue
        lat.append((starts[0] - due) * 1000)
    for r in replicas:
        r.send_signal(signal.SIGTERM)
    for r in replicas:
        r.wait()
    print(f"kill -9 of the leader 10 ms before a due time: due time -> its start on the "
          f"standby {quantiles(lat)}")


def find_leader(args, name, replicas):
    """The replica whose `lease run` holds the lease: its backend's client port is the
    `lease run` process's socket (pg_stat_activity's client_port, ss -tnp)."""
    like = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    sql = ("SELECT a.client_port FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
           "WHERE l.locktype = 'advisory' AND l.granted AND (a.application_name = "
           f"'lease:{name}' OR a.application_name LIKE 'lease:{like}@%')")
    port = subprocess.run(["psql", args.url, "-Atc", sql], capture_output=True, text=True).stdout.strip()
    ss = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True).stdout
    for line in ss.splitlines():
        if f":{port} " in line.split("users:")[0] or line.split()[3].endswith(f":{port}"):
            for r in replicas:
                if f"pid={r.pid}," in line:
                    return r
    return replicas[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lease", default="target/debug/lease")
    ap.add_argument("--url", default="host=127.0.0.1 port=5432 user=postgres dbname=postgres")
    ap.add_argument("--table", default="lease_schedule")
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("cases", nargs="*", default=["steady", "kill9"])
    args = ap.parse_args()
    subprocess.run([args.lease, "schedule", "init", "--state-table", args.table,
                    "--database-url", args.url], check=True, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            {"steady": steady, "kill9": kill9}[case](args, tmp)


if __name__ == "__main__":
    main()
