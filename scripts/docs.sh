#!/usr/bin/env bash
# The documentation book (docs/, mkdocs.yml):
#   scripts/docs.sh build   builds it into .cache/docs/site/ (`make docs`)
#   scripts/docs.sh check   builds it with every warning an error (a broken link or #anchor, a
#                           page missing from the navigation), checks the links that leave the
#                           book for the repository, then opens its pages in headless Chromium
#                           and checks they render; a screenshot of the landing page is left in
#                           .cache/docs/landing.png for a person to look at (`make test`).
#   scripts/docs.sh tools   only installs what the other two need (`make test` does it early,
#                           beside the builds).
# MkDocs and its theme come from PyPI, pinned in docs/requirements.txt, into a venv under
# ~/.cache/outbox-relay/ keyed by that file; Chromium from Debian's package.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-build}"
ROOT="$PWD"
OUT="$ROOT/.cache/docs"
key=$(sha256sum docs/requirements.txt | cut -c1-12)
VENV="$HOME/.cache/outbox-relay/docs-venv-$key"

if [ ! -x "$VENV/bin/mkdocs" ]; then
    echo "docs: installing MkDocs (docs/requirements.txt) into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV" || { echo "docs: python3 -m venv failed: install python3-venv (apt-get install python3-venv)" >&2; exit 1; }
    "$VENV/bin/pip" install -q --disable-pip-version-check -r docs/requirements.txt
fi

# Chromium opens the built pages (check only).
install_chromium() {
    command -v chromium >/dev/null && return 0
    if [ "$(id -u)" -eq 0 ]; then
        echo "docs: installing Chromium (Debian's chromium) to open the book"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "docs: Chromium is missing: sudo apt-get install chromium" >&2
        exit 1
    fi
}
if [ "$mode" = tools ]; then
    install_chromium
    exit 0
fi

# The deprecation banner of MkDocs 2 is for people choosing a tool, not for every build.
export NO_MKDOCS_2_WARNING=1
mkdir -p "$OUT"
"$VENV/bin/mkdocs" build --strict --quiet --site-dir "$OUT/site"
if [ "$mode" = build ]; then
    echo "docs: built into $OUT/site (open $OUT/site/index.html)"
    exit 0
fi
[ "$mode" = check ] || { echo "usage: scripts/docs.sh build|check|tools" >&2; exit 2; }
install_chromium

# Links from the book, the README and the alert rules into the repository are GitHub URLs
# (files outside docs/ are not pages of the book): each must name a file that exists. The
# README, read on GitHub, links to files and headings by relative links: each must resolve.
python3 "$ROOT/scripts/docs_check/links.py" "$ROOT"

# Headless Chromium loads each page from file:// and runs its scripts; --dump-dom prints the
# document as the browser built it. Root has no user namespace sandbox here, hence --no-sandbox.
chrome() { chromium --headless --no-sandbox --disable-gpu --hide-scrollbars "$@" 2>/dev/null; }
for page in index operations/backlog-too-old reference/api reference/cli reference/metrics; do
    mkdir -p "$OUT/dom/$(dirname "$page")"
    chrome --virtual-time-budget=3000 --dump-dom "file://$OUT/site/$page.html" > "$OUT/dom/$page.html"
done
chrome --virtual-time-budget=3000 --window-size=1280,1400 --screenshot="$OUT/landing.png" "file://$OUT/site/index.html" >/dev/null
python3 "$ROOT/scripts/docs_check/rendered.py" "$OUT" "$ROOT/mkdocs.yml"
