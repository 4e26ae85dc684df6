"""The built book as headless Chromium rendered it (scripts/docs.sh check dumps the DOMs and a
screenshot under OUT first): the landing page, the navigation, a runbook and the reference pages."""
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
