"""Every relative link in README.md, docs/ and deploy/ leads somewhere: the
file exists, and an anchor into a Markdown page names one of its headings
(GitHub's rule: lowercase, punctuation dropped, spaces to hyphens). And the
README stays a front door: short, with the two commands CI relies on."""

import re

from conftest import REPO

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _pages():
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "deploy").rglob("*.md"))]


def _prose(path):
    """The page's lines outside fenced code blocks."""
    inside, out = False, []
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            out.append(line)
    return out


def _slug(heading):
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path):
    return {_slug(line.lstrip("#")) for line in _prose(path) if line.startswith("#")}


def test_every_relative_link_resolves():
    broken = []
    for page in _pages():
        for line in _prose(page):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # http:, https:, mailto:
                file, _, anchor = target.partition("#")
                dest = (page.parent / file).resolve() if file else page
                where = f"{page.relative_to(REPO)}: {target}"
                if not dest.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    # The commands a newcomer runs, exactly as CI and the demo use them.
    assert "make demo-vllm" in text
    assert re.search(r"^make test\b", text, re.M)
    assert "make test" in (REPO / ".ci" / "run").read_text()
    assert "vllm serve" in text
