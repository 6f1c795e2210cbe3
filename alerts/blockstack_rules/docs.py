"""The documents a page links to, rendered to HTML: docs/runbook.md, docs/fleet.md and
docs/dashboard.md into docs/html/, which the stack's Prometheus serves at <its external URL>/user/
(--web.user-assets, blockstack_deploy/stack.py) and the Debian package ships. So an alert's
runbook_url ({{ $externalURL }}/user/runbook.html#its-name, the docs_url knob) opens on the host
that paged, with no repository or wiki to reach.

    python -m blockstack_rules.docs            # rewrite docs/html/ (make generate)
    python -m blockstack_rules.docs --check    # exit 1 if a page differs from what it would be

The anchors are GitHub's (a heading's text, lower case, punctuation dropped, spaces to hyphens), so
a runbook_url works the same on the rendered Markdown of a repository's web view (docs_url set to
one) and here. Links between the rendered documents are pointed at their .html; other links stay
as written (they name files of the repository).
"""

import argparse
import html
import re
import sys

from . import knobs

SOURCES = ("runbook.md", "fleet.md", "dashboard.md")
DOCS = knobs.REPO / "docs"
HTML = DOCS / "html"

PAGE = """<!DOCTYPE html>
<!-- GENERATED from docs/{source} by alerts/blockstack_rules/docs.py: edit the Markdown, then run `make generate` -->
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; max-width: 60em; margin: 1em auto; padding: 0 1em; line-height: 1.5; }}
code, pre {{ background: #f4f4f4; }}
pre {{ padding: 0.5em; overflow-x: auto; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: 0.2em 0.5em; vertical-align: top; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""


def github_slug(text, separator="-"):
    """A heading's anchor as GitHub makes it: lower case, what is not a word character, a hyphen
    or a space dropped, each space a hyphen (BlockStackMergeCollapse -> blockstackmergecollapse)."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", separator)


def anchors(page):
    """The id= of every element of an HTML page: what a #fragment can name."""
    return set(re.findall(r'\sid="([^"]+)"', page))


def render(source):
    """docs/<source> as an HTML page."""
    import markdown  # only `make generate` renders (the package ships the pages)

    text = (DOCS / source).read_text()
    body = markdown.markdown(
        text,
        extensions=["tables", "fenced_code", "toc"],
        extension_configs={"toc": {"slugify": github_slug}},
    )
    # links between the rendered documents: x.md -> x.html, the #fragment kept
    names = "|".join(re.escape(s[: -len(".md")]) for s in SOURCES)
    body = re.sub(rf'href="(?:\./)?({names})\.md(#[^"]*)?"', r'href="\1.html\2"', body)
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), source)
    return PAGE.format(source=source, title=html.escape(title), body=body)


def pages():
    """{output path: text} for every rendered document."""
    return {HTML / (source[: -len(".md")] + ".html"): render(source) for source in SOURCES}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = p.parse_args(argv)
    return knobs.write_or_check(pages(), args.check)


if __name__ == "__main__":
    sys.exit(main())
