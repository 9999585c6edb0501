#!/usr/bin/env python3
"""Takeover times of `lease run` at its default timings, against a real server.

Three replicas of `lease run NAME -- sh -c '...'` (no timing flag: every default)
per round; one event per round against the holder; the time from the event to the
next command's start, and the gap from the old command's end to it.

  graceful   SIGTERM to the holder's `lease run` (a rolling deploy)
  kill9      SIGKILL to the holder's `lease run`
  terminate  psql `select pg_terminate_backend(<holder's backend pid>)`
  freeze     SIGSTOP to the holder's `lease run` (its watchdog and command run on)
  partition  the holder reaches the server through a TCP proxy that starts
             dropping every byte both ways (the connection stays open)
  restart    `pg_ctl restart -m fast` of a cluster of the script's own
             (--restart-datadir, --restart-url; see docs/evidence.md)

Usage (from the repository root, after `cargo build -p lease-cli`):

  python3 bench/takeover-at-defaults.py --lease target/debug/lease \
      --url 'host=127.0.0.1 port=5432 user=postgres dbname=postgres' \
      --rounds 5 graceful kill9 terminate freeze partition

Python 3 standard library only; needs `psql` (and `pg_ctl` for restart).
"""

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

CMD = (
    'echo "START $$"; trap \'echo "STOP $$"; exit 0\' TERM; '
    "while :; do sleep 0.01; done"
)


class Replica:
    def __init__(self, lease, name, url, tag):
        self.tag = tag
        self.lines = []  # (monotonic time, line)
        self.proc = subprocess.Popen(
            [lease, "run", name, "--", "sh", "-c", CMD],
            env=dict(os.environ, DATABASE_URL=url, LEASE_LOG="info"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, prefix, after=0.0):
        for t, line in list(self.lines):
            if t >= after and line.startswith(prefix):
                return t, line
        return None

    def command_pids(self):
        return [int(l.split()[1]) for _, l in list(self.lines) if l.startswith("START ")]

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in self.command_pids():
            wait_gone(pid, 5)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def wait_gone(pid, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not alive(pid):
            return time.monotonic()
        time.sleep(0.0005)
    return None


class Proxy:
    """Loopback TCP proxy; `cut()` drops every byte both ways and keeps sockets open."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.cut_ = False
        self.held = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self):
        self.cut_ = True

    def _accept(self):
        while True:
            c, _ = self.listener.accept()
            self.held.append(c)
            if self.cut_:
                continue  # a new connection during the partition: never answered
            u = socket.create_connection(self.upstream)
            self.held.append(u)
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    if not self.cut_:
                        b.shutdown(socket.SHUT_WR)
                    return
                if not self.cut_:
                    b.sendall(data)
        except OSError:
            return


def server_ready(log, offset):
    """The monotonic time of the server log's "ready to accept connections" line written
    after `offset` (log_line_prefix %m: wall-clock milliseconds)."""
    import datetime
    with open(log) as f:
        f.seek(offset)
        for line in f:
            if "ready to accept connections" in line:
                stamp = " ".join(line.split()[:2])
                wall = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").replace(
                    tzinfo=datetime.timezone.utc).timestamp()
                return wall - (time.time() - time.monotonic())
    raise RuntimeError("no ready line in the server log")


def psql(url):
    return subprocess.Popen(
        ["psql", "-X", "-q", "-At", url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def holder_backend(url, key):
    hi, lo = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
    q = (
        "select pid from pg_locks where locktype = 'advisory' and granted "
        f"and classid = {hi} and objid = {lo} and objsubid = 1"
    )
    out = subprocess.run(["psql", "-X", "-At", url, "-c", q], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def round_(args, scenario, n):
    name = f"takeover-at-defaults-{os.getpid()}-{scenario}-{n}"
    url = args.restart_url if scenario == "restart" else args.url
    proxy = None
    a_url = url
    if scenario == "partition":
        host = dict(kv.split("=", 1) for kv in url.split())
        proxy = Proxy((host.get("host", "127.0.0.1"), int(host.get("port", "5432"))))
        a_url = url.replace(f"port={host.get('port', '5432')}", "") + f" port={proxy.port}"
    reps = [Replica(args.lease, name, a_url, "A")]
    try:
        deadline = time.monotonic() + 30
        while not reps[0].first("START") and time.monotonic() < deadline:
            time.sleep(0.01)
        a = reps[0]
        if not a.first("START"):
            raise RuntimeError("A never started: " + "\n".join(l for _, l in a.lines[-5:]))
        reps += [Replica(args.lease, name, url, t) for t in ("B", "C")]
        # settle: the standbys' first tries, then waits on the server; then a random
        # moment within a heartbeat interval, so the freeze is not in step with it
        time.sleep(3 + random.uniform(0, 5))
        key = int(subprocess.run([args.lease, "key", name], capture_output=True, text=True).stdout)
        a_cmd = a.command_pids()[0]
        gone = {}
        threading.Thread(target=lambda: gone.setdefault("t", wait_gone(a_cmd, 60)),
                         daemon=True).start()
        if scenario == "terminate":
            backend = holder_backend(url, key)
            p = psql(url)
            time.sleep(0.3)
            t0 = time.monotonic()
            p.stdin.write(f"select pg_terminate_backend({backend});\n")
            p.stdin.close()
            p.wait()
        elif scenario == "restart":
            log_size = os.path.getsize(args.restart_log)
            t0 = time.monotonic()
            subprocess.run(
                ["runuser", "-u", args.restart_user, "--", args.pg_ctl, "-D", args.restart_datadir,
                 "-m", "fast", "-w", "restart", "-o", args.restart_opts, "-l", args.restart_log],
                check=True, capture_output=True)
            ready = server_ready(args.restart_log, log_size)
        else:
            t0 = time.monotonic()
            if scenario == "graceful":
                os.kill(a.proc.pid, signal.SIGTERM)
            elif scenario == "kill9":
                os.kill(a.proc.pid, signal.SIGKILL)
            elif scenario == "freeze":
                os.kill(a.proc.pid, signal.SIGSTOP)
            elif scenario == "partition":
                proxy.cut()
        deadline = time.monotonic() + 40
        start = None
        while time.monotonic() < deadline:
            starts = [r.first("START", after=t0) for r in reps]
            starts = [s[0] for s in starts if s]
            if starts:
                start = min(starts)
                break
            time.sleep(0.001)
        end = time.monotonic() + 20
        while "t" not in gone and time.monotonic() < end:
            time.sleep(0.01)
        a_gone = gone.get("t")
        row = {"scenario": scenario, "takeover_ms": None if start is None else (start - t0) * 1e3,
               "old_command_end_ms": None if a_gone is None else (a_gone - t0) * 1e3}
        if start is not None and a_gone is not None:
            row["gap_ms"] = (start - a_gone) * 1e3
        if scenario == "restart":
            row["ready_ms"] = (ready - t0) * 1e3
            if start is not None:
                row["after_ready_ms"] = (start - ready) * 1e3
        return row
    finally:
        for r in reps:
            r.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lease", default="target/debug/lease")
    p.add_argument("--url", default="host=127.0.0.1 port=5432 user=postgres dbname=postgres")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--restart-url", default="host=127.0.0.1 port=5499 user=postgres dbname=postgres")
    p.add_argument("--restart-datadir", default="/tmp/docs33-pg/data")
    p.add_argument("--restart-opts", default="-p 5499 -k /tmp/docs33-pg -c listen_addresses=127.0.0.1")
    p.add_argument("--restart-log", default="/tmp/docs33-pg/log")
    p.add_argument("--restart-user", default="leasetest")
    p.add_argument("--pg-ctl", default="pg_ctl")
    p.add_argument("scenarios", nargs="+")
    args = p.parse_args()
    for s in args.scenarios:
        rows = []
        for n in range(args.rounds):
            row = round_(args, s, n)
            rows.append(row)
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)
        vals = [r["takeover_ms"] for r in rows if r["takeover_ms"] is not None]
        if vals:
            print(f"SUMMARY {s}: takeover median {statistics.median(vals):.1f} ms, "
                  f"min {min(vals):.1f}, max {max(vals):.1f}, n={len(vals)} of {len(rows)}",
                  flush=True)
        gaps = [r["gap_ms"] for r in rows if "gap_ms" in r]
        if gaps:
            print(f"SUMMARY {s}: old command end to new start: min {min(gaps):.1f} ms, "
                  f"max {max(gaps):.1f} ms (negative: overlap)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
