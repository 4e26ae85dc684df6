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
python3 - "$ROOT" <<'PY'
import os, re, sys
root = sys.argv[1]
base = "https://github.com/outbox-relay/outbox-relay/blob/main/"
files = ["README.md", "config/prometheus/outbox-relay-alerts.yaml"]
for dirpath, _, names in os.walk(os.path.join(root, "docs")):
    files += [os.path.relpath(os.path.join(dirpath, n), root) for n in names if n.endswith(".md")]
broken = []
for f in sorted(files):
    for url in re.findall(re.escape(base) + r"([^)\s#'\"]+)", open(os.path.join(root, f)).read()):
        if not os.path.exists(os.path.join(root, url)):
            broken.append(f"{f}: {base}{url}")
if broken:
    sys.exit("docs: links to files the repository does not have:\n  " + "\n  ".join(broken))
print(f"docs: every repository link of {len(files)} files names a file that exists")


def github_anchor(heading):
    """The id GitHub gives a Markdown heading: the text as rendered (code spans and links as
    their text), lowercased, without punctuation other than '-' and '_', spaces as '-'."""
    text = heading.replace("`", "")
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def markdown_anchors(path):
    text = re.sub(r"^```.*?^```", "", open(path).read(), flags=re.S | re.M)
    anchors, seen = set(), {}
    for m in re.finditer(r"^#{1,6} +(.+?)\s*$", text, re.M):
        anchor = github_anchor(m.group(1))
        n = seen.get(anchor, 0)
        anchors.add(anchor if n == 0 else f"{anchor}-{n}")  # GitHub numbers repeated headings
        seen[anchor] = n + 1
    return anchors


def readme_links():
    """The README is read on GitHub, outside the book (whose own links `mkdocs build --strict`
    checks): every relative link names a file of the repository, and an #anchor a heading of
    it (or of the README itself)."""
    text = re.sub(r"^```.*?^```", "", open(os.path.join(root, "README.md")).read(), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = os.path.join(root, path) if path else os.path.join(root, "README.md")
        if not os.path.exists(file):
            broken.append(target)
        elif anchor and (not file.endswith(".md") or anchor not in markdown_anchors(file)):
            broken.append(target)
    return broken


broken = readme_links()
if broken:
    sys.exit(f"docs: README.md links to no file or no heading (GitHub's anchors): {broken}")
print("docs: every relative link and #anchor of README.md resolves")
PY

# Headless Chromium loads each page from file:// and runs its scripts; --dump-dom prints the
# document as the browser built it. Root has no user namespace sandbox here, hence --no-sandbox.
chrome() { chromium --headless --no-sandbox --disable-gpu --hide-scrollbars "$@" 2>/dev/null; }
for page in index operations/backlog-too-old reference/api reference/cli reference/metrics; do
    mkdir -p "$OUT/dom/$(dirname "$page")"
    chrome --virtual-time-budget=3000 --dump-dom "file://$OUT/site/$page.html" > "$OUT/dom/$page.html"
done
chrome --virtual-time-budget=3000 --window-size=1280,1400 --screenshot="$OUT/landing.png" "file://$OUT/site/index.html" >/dev/null
python3 - "$OUT" "$ROOT/mkdocs.yml" <<'PY'
import os, re, sys
out, mkdocs_yml = sys.argv[1], sys.argv[2]
def dom(page):
    return open(os.path.join(out, "dom", page + ".html")).read()
def text(html):
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
nav_pages = re.findall(r"^\s+- (?:[^:\n]+: )?([\w/.-]+\.md)\s*$", open(mkdocs_yml).read(), re.M)
problems = []
def expect(ok, what):
    if not ok:
        problems.append(what)
index = dom("index")
expect(re.search(r"<title>\s*Outbox Relay\s*</title>", index), "the landing page's <title> is not 'Outbox Relay'")
expect("Where to go next" in text(index), "the landing page's body did not render")
links = set(re.findall(r'class="md-nav__link[^"]*"[^>]*href="([^"]+)"|href="([^"]+)"[^>]*class="md-nav__link', index))
hrefs = {a or b for a, b in links}
missing = [p for p in nav_pages if p.replace(".md", ".html") not in hrefs and p != "index.md"]
expect(not missing, f"the navigation lacks {missing}")
expect(os.path.getsize(os.path.join(out, "landing.png")) > 10000, "the landing page's screenshot is empty")
runbook = dom("operations/backlog-too-old")
expect("OutboxRelayBacklogTooOld" in text(runbook), "the runbook page did not render its alert")
api = dom("reference/api")
expect(api.count("<table") >= 5, f"the API reference shows {api.count('<table')} tables, not one per object")
for field in ("spec.database", "spec.broker", "spec.relay", "spec.scaling", "urlSecretRef"):
    expect(field in text(api), f"the API reference does not show {field}")
expect("outbox-relay run" in text(dom("reference/cli")), "the CLI reference does not show `outbox-relay run`")
expect("outbox_relay_messages_published_total" in text(dom("reference/metrics")), "the metrics reference does not show outbox_relay_messages_published_total")
if problems:
    sys.exit("docs: the built book, opened in headless Chromium:\n  " + "\n  ".join(problems))
print(f"docs: the book renders in Chromium: landing page, navigation of {len(nav_pages)} pages, a runbook and the three reference pages ({out}/landing.png)")
PY
