#!/usr/bin/env python3
"""Runs every test of the workspace, as `make test` does, in two phases.

The end-to-end test binaries spend most of their time waiting: on a control plane starting, a
kubelet pulling and starting pods, an operator's cooldowns. Measured alone on 2 cores, the
autoscaling binary keeps the CPU 22 % busy for 3.5 minutes, the relay pods' 18 %. Run one after
another, as `cargo test --workspace` does, they took about 9 of the 12 minutes of the tests.

1. The waiting binaries (WAITING below) run side by side, LANES at a time (3 by default), the
   longest first. Each starts its own control plane, node and namespaces, and uses its own
   tables, exchanges and databases, so they cannot see each other. Beside them, in TEST_SIDE_LANES
   lanes of their own (2 by default), run the jobs that wait on servers of their own or on the
   clock rather than on the CPU (SIDE below): the PostgreSQL matrix, the broker matrix
   (RabbitMQ 4.0), the failover scenarios (clusters and pairs stopped, killed and brought back)
   and the services binary's tests that watch a relay's log for a minute (SIDE_MODULES). The
   e2e binaries keep about a fifth of the 2 cores busy each when alone; all together, phase 1
   keeps both cores busy (vmstat: 0 to 5 % idle most of the time, 2026-12-07), so more lanes
   would not make it shorter. The RabbitMQ cluster's scenarios wait for that cluster's lease,
   which the soak and the e2e failover binary take early in phase 1; the PostgreSQL pairs and
   the Artemis pairs need no lease and start at once. TEST_SIDE_LANES=0 runs them all in
   phase 2 instead.
2. Then, one at a time as before, whatever keeps the CPU busy: the unit tests, every other test
   target (found with `cargo metadata`, so a new one is never left out) and the operator's
   database tests once more against database `postgres`. The services binary, for one, keeps
   both cores busy for its 3 minutes, and the autoscaling scenarios would measure the machine
   rather than the operator if it ran beside them; the failover scenarios' clusters beside its
   timing tests (the claim cursor's) slowed those past what they measure.

Each job's output is printed whole when it ends, one job after another, never interleaved; a
failed job's is printed again at the end. TEST_LANES=1 runs phase 1 one binary at a time.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

CARGO = os.environ.get("CARGO", "cargo")
LANES = int(os.environ.get("TEST_LANES", "3"))
SIDE_LANES = int(os.environ.get("TEST_SIDE_LANES", "2"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The binaries of outbox-tests that mostly wait on a control plane, with their seconds when run
# alone on 2 cores (2026-12-04): the order they start in, the longest first.
WAITING = {
    "e2e_autoscaling": 215,
    # 2026-12-05, with the suspend test beside the others (30 s alone, image build included).
    "e2e_relay_pods": 66,
    "e2e_failover": 57,
    "e2e_node_drain": 52,
    # 2026-12-05, with the previous release cached (scripts/previous-release.sh, make test's
    # first step) and make dist's tools built.
    "e2e_upgrade": 50,
    "e2e_amqp10_operator": 48,
    "e2e_make_cluster": 37,
    "e2e_deletion": 34,
    "e2e_leader_election": 31,
    "e2e_release_install": 28,
    "e2e_first_hour": 24,
    "e2e_secure_operator": 23,
    "e2e_vacuum_blocked": 20,
    "e2e_helm_install": 18,
    "e2e_crd_on_apiserver": 10,
    # 2026-12-06: 100 suspended OutboxRelays over 10 databases, the operator as a process.
    "long_operator_scale": 40,
    # 2026-12-07: 18 periods of 6 s after the pods drain 20,000 rows, under the cluster lease.
    "long_soak": 150,
    "e2e_real_node": 8,
}
# The modules of the services binary that start their own servers (the RabbitMQ 3.10 and 4.0
# clusters, PostgreSQL standby pairs, Artemis primary/backup pairs) and fail them over: run as
# jobs of their own (see plan()). The RabbitMQ clusters' scenarios wait on the cluster's lease
# (outbox_tests::rabbit_cluster::Lease); the pairs' need none.
FAILOVER_WITHOUT_LEASE = ["artemis_pair", "pg_failover"]
FAILOVER_UNDER_LEASE = ["broker_cluster"]
# The modules of the services binary whose tests watch a relay's log over a window of a minute
# (each test 60 to 70 s of waiting, 437 s of the binary's 1,439 s of tests on 2026-12-07): run as
# a job of their own beside phase 1, all at once, rather than holding phase 2's threads.
MINUTE_WATCHERS = ["retried_causes"]
SIDE_MODULES = FAILOVER_WITHOUT_LEASE + FAILOVER_UNDER_LEASE + MINUTE_WATCHERS
RELEASE = [CARGO, "test", "--release"]
THREADS = ["--", "--test-threads=4"]


def services_port(name):
    """The port NAME of scripts/services/ports.env (NAME=value lines, # comments), where
    scripts/services.sh starts its servers."""
    with open(os.path.join(ROOT, "scripts", "services", "ports.env")) as ports:
        for line in ports:
            key, equals, value = line.strip().partition("=")
            if equals and key == name:
                return int(value)
    raise KeyError(f"scripts/services/ports.env has no line {name}=")


# The operator's database tests run a second time against this database, which they must leave
# as they found it (LEFTOVER).
POSTGRES_URL = f"postgres://postgres@127.0.0.1:{services_port('PG_PORT')}/postgres"
# What those tests could leave behind, taken before and after their run: schemas (theirs are
# `s_<uuid>`), tables, indexes and functions anywhere outside the catalogs (`public` included: an
# unqualified table name puts the claims and report tables there), triggers, and their databases
# (`horizon_<uuid>`; only theirs, as other databases on the server are not this run's).
LEFTOVER = """
SELECT 'schema ' || nspname FROM pg_namespace
  WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'
UNION ALL
SELECT 'relation ' || c.oid::regclass::text || ' (' || c.relkind::text || ')'
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
  WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
UNION ALL
SELECT 'trigger ' || tgname || ' on ' || tgrelid::regclass::text FROM pg_trigger WHERE NOT tgisinternal
UNION ALL
SELECT 'database ' || datname FROM pg_database WHERE datname LIKE 'horizon\\_%'
"""
# The relay's own tables a run may find there already (left by an older run, or the user's):
# their rows are counted too, so a claim or a report row left in them shows.
RELAY_TABLES = ("outbox_relay_claims", "outbox_relay_reports")


class PsqlFailed(Exception):
    pass


def psql(url, sql):
    done = subprocess.run(["psql", url, "-XAtc", sql], capture_output=True, text=True)
    if done.returncode != 0:
        raise PsqlFailed(f"psql {url} failed: {done.stderr.strip()}")
    return done.stdout.splitlines()


def database_objects(url):
    """What the database at `url` holds of what LEFTOVER lists, as lines to compare."""
    lines = psql(url, LEFTOVER)
    for line in list(lines):
        kind, _, rest = line.partition(" ")
        name = rest.rsplit(" (", 1)[0]
        if kind == "relation" and name.rsplit(".", 1)[-1] in RELAY_TABLES:
            rows = psql(url, f"SELECT count(*) FROM {name}")[0]
            lines.append(f"rows of {name}: {rows}")
    return set(lines)


class Job:
    def __init__(self, name, argv, env=None, weight=0, unchanged=None):
        """`unchanged`: a database URL the job must leave as it found it (LEFTOVER)."""
        self.name, self.argv, self.env, self.weight = name, argv, env or {}, weight
        self.unchanged = unchanged
        self.status, self.seconds, self.output = None, 0.0, ""

    def run(self):
        started = time.monotonic()
        try:
            self.run_checked()
        except PsqlFailed as error:
            self.output += f"\nthe leftover check could not read the database: {error}\n"
            self.status = self.status or 1
        self.seconds = time.monotonic() - started

    def run_checked(self):
        before = database_objects(self.unchanged) if self.unchanged else None
        with tempfile.TemporaryFile(mode="w+") as log:
            process = subprocess.run(
                self.argv, cwd=ROOT, env={**os.environ, **self.env},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
            log.seek(0)
            self.output = log.read()
        self.status = process.returncode
        if before is not None:
            after = database_objects(self.unchanged)
            if after != before:
                changes = [f"  left: {line}" for line in sorted(after - before)]
                changes += [f"  gone: {line}" for line in sorted(before - after)]
                self.output += (
                    f"\nthe tests did not leave {self.unchanged} as they found it:\n"
                    + "\n".join(changes) + "\n"
                )
                self.status = self.status or 1


def workspace_test_targets():
    """(package, integration test target) for every member of the workspace."""
    metadata = json.loads(subprocess.run(
        [CARGO, "metadata", "--no-deps", "--format-version", "1"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout)
    return [
        (package["name"], target["name"])
        for package in metadata["packages"]
        for target in package["targets"]
        if "test" in target["kind"]
    ]


def plan():
    targets = workspace_test_targets()
    waiting_found = {name for package, name in targets if package == "outbox-tests" and name in WAITING}
    missing = set(WAITING) - waiting_found
    if missing:
        sys.exit(f"test-suite: WAITING names test targets outbox-tests does not have: {sorted(missing)}")
    waiting = [
        Job(name, RELEASE + ["-p", "outbox-tests", "--test", name] + THREADS, weight=WAITING[name])
        for name in waiting_found
    ]
    # The tests that need an API server only (the CRD, the chart, the operator as a process),
    # once more on the oldest Kubernetes minor the chart supports.
    waiting.append(Job(
        "e2e_crd_on_apiserver + e2e_helm_install on the oldest Kubernetes",
        RELEASE + ["-p", "outbox-tests", "--test", "e2e_crd_on_apiserver", "--test", "e2e_helm_install"],
        env={"OUTBOX_KUBERNETES": "oldest"},
        weight=WAITING["e2e_crd_on_apiserver"] + WAITING["e2e_helm_install"],
    ))
    waiting.sort(key=lambda job: -job.weight)

    busy = [
        Job("unit tests", RELEASE + ["--workspace", "--lib", "--bins"] + THREADS),
        Job("doc tests", RELEASE + ["--workspace", "--doc"]),
    ]
    for package in sorted({package for package, _ in targets}):
        names = [name for p, name in targets if p == package and not (p == "outbox-tests" and name in WAITING)]
        if names:
            selection = [arg for name in sorted(names) for arg in ("--test", name)]
            skip = [arg for module in SIDE_MODULES for arg in ("--skip", f"{module}::")] if package == "outbox-tests" else []
            busy.append(Job(f"{package}: {', '.join(sorted(names))}", RELEASE + ["-p", package] + selection + THREADS + skip))
    # The failover scenarios, apart from the rest of the services binary: a three-node RabbitMQ
    # cluster and standby pairs beside the timing tests (the claim cursor's) slowed those past
    # what they measure.
    def services_modules(what, modules, threads=THREADS):
        return Job(
            f"outbox-tests: services, {what} ({', '.join(modules)})",
            RELEASE + ["-p", "outbox-tests", "--test", "services"] + threads + [f"{m}::" for m in modules],
        )
    # Once more against a database not named `test`: URLs made from DATABASE_URL must be
    # parsed, not edited as text, and the tests must leave that database as they found it.
    operator_database_tests = ["services_postgres_database", "services_postgres_cleanup"]
    busy.append(Job(
        f"{' + '.join(operator_database_tests)} against database postgres",
        RELEASE + ["--workspace"]
        + [arg for name in operator_database_tests for arg in ("--test", name)] + THREADS,
        env={"DATABASE_URL": POSTGRES_URL}, unchanged=POSTGRES_URL,
    ))
    # The longest first; the RabbitMQ clusters' scenarios (298 s, 2026-12-07) as soon as a lane
    # is free after the pairs', so that their wait for the lease overlaps the soak's and
    # e2e_failover's hold of it rather than coming after it.
    side = [
        # The tests that touch PostgreSQL's behaviour, against every other major services.sh runs.
        Job("PostgreSQL matrix", ["./scripts/postgres-matrix.sh"]),
        services_modules("the failover scenarios without a lease", FAILOVER_WITHOUT_LEASE),
        # Every test at once: the 3.10 and 4.0 clusters have a lease each, so the 4.0 scenarios
        # run while the 3.10 ones wait for theirs. On 4 threads the 3.10 ones held every thread
        # waiting, and the 4.0 ones came after them: 699 s of a newcomer's 845 s phase 1
        # (2026-12-07).
        services_modules("the failover scenarios under the cluster lease", FAILOVER_UNDER_LEASE,
                         ["--", "--test-threads=16"]),
        # The tests of the broker's behaviour, against RabbitMQ 4.0 beside 3.10.
        Job("broker matrix (RabbitMQ 4.0)", ["./scripts/broker-matrix.sh"]),
        # Every test at once: they wait out a minute each.
        services_modules("a minute of a relay's log", MINUTE_WATCHERS, ["--", "--test-threads=16"]),
    ]
    if SIDE_LANES == 0:
        busy, side = busy + side, []
    return waiting, side, busy


def report(job, lock):
    with lock:
        verdict = "ok" if job.status == 0 else f"FAILED (exit {job.status})"
        print(f"\n===== {job.name}: {verdict} in {job.seconds:.0f} s", flush=True)
        sys.stdout.write(job.output)
        sys.stdout.flush()


def run_side_by_side(jobs, lanes, lock):
    queue = list(jobs)

    def lane():
        while True:
            with lock:
                if not queue:
                    return
                job = queue.pop(0)
            job.run()
            report(job, lock)

    threads = [threading.Thread(target=lane) for _ in range(max(1, lanes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main():
    waiting, side, busy = plan()
    lock = threading.Lock()
    started = time.monotonic()
    print(f"test-suite: phase 1, {len(waiting)} end-to-end jobs, {LANES} at a time, and "
          f"{len(side)} jobs beside them, {SIDE_LANES} at a time", flush=True)
    side_lane = threading.Thread(target=run_side_by_side, args=(side, SIDE_LANES, lock))
    side_lane.start()
    run_side_by_side(waiting, LANES, lock)
    side_lane.join()
    phase1 = time.monotonic() - started
    print(f"\ntest-suite: phase 2, {len(busy)} jobs one at a time", flush=True)
    run_side_by_side(busy, 1, lock)
    total = time.monotonic() - started

    jobs = waiting + side + busy
    failed = [job for job in jobs if job.status != 0]
    print(f"\ntest-suite: phase 1 took {phase1:.0f} s, phase 2 {total - phase1:.0f} s, {total:.0f} s in all")
    for job in sorted(jobs, key=lambda job: -job.seconds):
        print(f"  {job.seconds:6.0f} s  {'ok    ' if job.status == 0 else 'FAILED'}  {job.name}")
    if failed:
        for job in failed:
            print(f"\n===== again, the output of the failed job {job.name}")
            sys.stdout.write(job.output)
        sys.exit(f"test-suite: {len(failed)} of {len(jobs)} jobs failed: {', '.join(job.name for job in failed)}")


if __name__ == "__main__":
    main()
