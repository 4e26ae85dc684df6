#!/usr/bin/env bash
# The lint of the repository's scripts (part of `make lint`):
#   every shell script     bash -n, then shellcheck -x (the files scripts/services.sh sources
#                          included, each on its own): every *.sh, and every file whose first
#                          line is a sh or bash #!
#   every Python file      python3 -m py_compile, then pyflakes
# The shellcheck binary is Debian's package: .ci/run installs it with the other packages; here
# it is installed with apt-get when missing and we are root, or the command to run is said. pyflakes
# comes from PyPI, pinned, into a venv under ~/.cache/outbox-relay/ keyed by its version.
set -euo pipefail
cd "$(dirname "$0")/.."

PYFLAKES_VERSION=3.4.0
VENV="$HOME/.cache/outbox-relay/lint-venv-pyflakes-$PYFLAKES_VERSION"

say() { echo "lint-scripts: $*"; }

if ! command -v shellcheck >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        say "shellcheck is missing: sudo apt-get install shellcheck" >&2
        exit 1
    fi
    say "installing shellcheck (Debian's shellcheck) with apt-get"
    # make test runs this beside scripts/services.sh, which may hold apt's lock: wait for it.
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq shellcheck >/dev/null
fi

if [ ! -x "$VENV/bin/pyflakes" ]; then
    say "installing pyflakes $PYFLAKES_VERSION into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV" || { say "python3 -m venv failed: install python3-venv (apt-get install python3-venv)" >&2; exit 1; }
    "$VENV/bin/pip" install -q --disable-pip-version-check "pyflakes==$PYFLAKES_VERSION"
fi

# The tracked files (a copy without .git: every file under the tree, but .cache and target).
files() {
    git ls-files --cached --others --exclude-standard 2>/dev/null || find . -path ./.cache -prune -o -path ./target -prune -o -path ./.git -prune \
        -o -type f -print | sed 's|^\./||'
}
shell=() python=()
while IFS= read -r f; do
    [ -f "$f" ] || continue
    case "$f" in
        *.sh) shell+=("$f") ;;
        *.py) python+=("$f") ;;
        *) head -n1 "$f" 2>/dev/null | grep -Eq '^#!.*[/ ](ba)?sh( |$)' && shell+=("$f") ;;
    esac
done < <(files | sort)

failed=0
for f in "${shell[@]}"; do
    bash -n "$f" || { say "bash -n $f failed"; failed=1; }
done
shellcheck -x "${shell[@]}" || failed=1
say "shellcheck $(shellcheck --version | sed -n 's/^version: //p'): ${#shell[@]} shell scripts"

# The byte code goes to a folder of its own, not beside the sources.
pycache=$(mktemp -d)
trap 'rm -rf "$pycache"' EXIT
PYTHONPYCACHEPREFIX="$pycache" python3 -m py_compile "${python[@]}" || failed=1
"$VENV/bin/pyflakes" "${python[@]}" || failed=1
say "py_compile and pyflakes $PYFLAKES_VERSION: ${#python[@]} Python files"

[ "$failed" = 0 ] || { say "failed (above)"; exit 1; }
