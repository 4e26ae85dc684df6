#!/usr/bin/env bash
# make cluster / make cluster-down: a local Kubernetes control plane with the operator installed,
# to try it without a cluster (README, "Try it on a local control plane").
#
#   cluster.sh up     starts outbox-cluster in the background, in its own session (so neither
#                     make's Ctrl-C nor closing the terminal stops it), waits until it wrote its
#                     kubeconfig and the API server answers /readyz, and prints KUBECONFIG=<path>
#                     and where kubectl and helm are. Already running: prints the same lines.
#   cluster.sh down   SIGTERM, a bounded wait for a clean stop (relays get their grace period),
#                     SIGKILL after that; then checks that none of its processes is left.
#
# Environment:
#   CLUSTER_DIR            its files: kubeconfig, pid, cluster.log, logs/, plane/ (default
#                          <repo>/.cache/cluster)
#   CLUSTER_BIN            the outbox-cluster to run (default <target dir>/release/outbox-cluster);
#                          the outbox-relay and outbox-operator next to it are the ones it runs
#   CLUSTER_START_TIMEOUT  seconds to wait for the start (default 300)
#   CLUSTER_STOP_TIMEOUT   seconds to wait for a clean stop before SIGKILL (default 120)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${CLUSTER_DIR:-$ROOT/.cache/cluster}"
BIN="${CLUSTER_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/outbox-cluster}"
START_TIMEOUT="${CLUSTER_START_TIMEOUT:-300}"
STOP_TIMEOUT="${CLUSTER_STOP_TIMEOUT:-120}"
PIDFILE="$DIR/pid"
LOG="$DIR/cluster.log"

say() { echo "cluster: $*" >&2; }

# The pid of this folder's outbox-cluster while it runs (the pid file may be stale, and pids are
# reused: the process must be an outbox-cluster).
running_pid() {
    local pid
    pid="$(cat "$PIDFILE" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    alive "$pid" || return 1
    [[ "$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 1)" == *outbox-cluster ]] || return 1
    echo "$pid"
}

# Fields 3… of /proc/PID/stat (after the command name, which may hold spaces).
stat_fields() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null; }

# Whether the process exists and is not a zombie.
alive() {
    local state
    state="$(stat_fields "$1" | cut -d' ' -f1)"
    [ -n "$state" ] && [ "$state" != Z ]
}

# PID:STARTTIME of every descendant of a process: the start time tells a process from a later
# one that got its pid.
descendants() {
    local child
    for child in $(pgrep -P "$1" || true); do
        echo "$child:$(stat_fields "$child" | cut -d' ' -f20)"
        descendants "$child"
    done
}

# Whether PID:STARTTIME is still that process, alive.
still_there() {
    local pid="${1%%:*}"
    alive "$pid" && [ "$(stat_fields "$pid" | cut -d' ' -f20)" = "${1#*:}" ]
}

tail_log() {
    echo "--- last 40 lines of $LOG ---" >&2
    tail -n 40 "$LOG" >&2 || true
}

info() { grep -E '^(KUBECONFIG=|kubectl: |helm: |logs: )' "$LOG"; }

up() {
    local pid
    if pid="$(running_pid)"; then
        say "already running (pid $pid); make cluster-down stops it"
        info
        return 0
    fi
    if [ ! -x "$BIN" ]; then
        say "$BIN is missing: \`make cluster\` builds it (or set CLUSTER_BIN)"
        return 1
    fi
    mkdir -p "$DIR"
    say "starting $BIN (log: $LOG)"
    # A new session: no controlling terminal, so no SIGHUP, and not in make's process group.
    setsid "$BIN" --dir "$DIR" </dev/null >"$LOG" 2>&1 &
    local launched=$! deadline=$((SECONDS + START_TIMEOUT)) kubectl
    until grep -q '^KUBECONFIG=' "$LOG" 2>/dev/null; do
        if ! alive "$launched" && ! running_pid >/dev/null; then
            say "outbox-cluster exited during start-up"
            tail_log
            return 1
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            say "not up after ${START_TIMEOUT}s; stopping it"
            tail_log
            down >&2 || true
            return 1
        fi
        sleep 0.5
    done
    kubectl="$(sed -n 's/^kubectl: \([^ ]*\).*/\1/p' "$LOG")"
    until [ "$("$kubectl" --kubeconfig "$DIR/kubeconfig" get --raw /readyz 2>/dev/null)" = ok ]; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            say "the API server is not ready after ${START_TIMEOUT}s; stopping it"
            tail_log
            down >&2 || true
            return 1
        fi
        sleep 0.5
    done
    info
    say "up; \`make cluster-down\` stops it"
}

down() {
    local pid
    if ! pid="$(running_pid)"; then
        say "not running"
        rm -f "$PIDFILE" "$DIR/kubeconfig"
        return 0
    fi
    local tree
    tree="$(descendants "$pid")"
    say "stopping pid $pid and its $(wc -w <<<"$tree") processes"
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 0.5
    done
    if alive "$pid"; then
        say "still running after ${STOP_TIMEOUT}s: SIGKILL (its processes die with it)"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    # The parent-death signal reaches every process it started; give the kernel a moment, then
    # SIGKILL any that is still there, and say so.
    local left="" p
    for _ in $(seq 1 20); do
        left=""
        for p in $tree; do
            if still_there "$p"; then left+=" ${p%%:*}"; fi
        done
        [ -z "$left" ] && break
        sleep 0.25
    done
    if [ -n "$left" ]; then
        say "SIGKILL to what is left:$left"
        # shellcheck disable=SC2086
        kill -KILL $left 2>/dev/null || true
    fi
    rm -f "$PIDFILE" "$DIR/kubeconfig"
    say "stopped"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *)
        echo "usage: $0 up|down" >&2
        exit 2
        ;;
esac
