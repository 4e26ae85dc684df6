"""The docs' links: every GitHub URL into the repository from the book, the README and the alert
rules names a file that exists, and every relative link and #anchor of README.md resolves.
Run by scripts/docs.sh check with the repository's root."""
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
