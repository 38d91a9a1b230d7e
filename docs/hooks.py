"""MkDocs hooks (mkdocs.yml `hooks:`): the README is the site's front page and CHANGELOG.md a page, and the
links written for GitHub work on the site too.

Every link is written relative to the file it is in, as GitHub reads it. On the site a link to a file that has
a page (docs/, README.md, CHANGELOG.md) points at that page; a link to any other file of the repository
(bench/README.md, LICENSE, tests/...) has no page to open, so it becomes the file's path as code text.
"""

import logging
import posixpath
import re

from mkdocs.structure.files import File
from mkdocs.structure.nav import Link

log = logging.getLogger("mkdocs.hooks")

# The repository's files outside docs/ that have a page, and the page's name on the site.
PAGES = {"README.md": "index.md", "CHANGELOG.md": "changelog.md"}
# The tutorial is two sections of the front page. A `nav:` entry cannot point into a page, so the hook adds
# these to mkdocs.yml's empty Tutorial section: {title: the README heading's anchor}.
TUTORIAL = {"Quickstart": "quickstart", "Fashion-MNIST example": "the-main-example-fashion-mnist"}
# [text](target), not ![image](...); the pages' links are all of this inline form.
_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")


def on_files(files, config):
    root = posixpath.dirname(config.config_file_path)
    for source, page in PAGES.items():
        with open(posixpath.join(root, source)) as f:
            files.append(File.generated(config, page, content=f.read()))
    return files


def on_nav(nav, config, files):
    tutorial = next(item for item in nav.items if item.title == "Tutorial")
    tutorial.children = [Link(title, "./#" + anchor) for title, anchor in TUTORIAL.items()]
    for link in tutorial.children:
        link.parent = tutorial
    return nav


def on_page_markdown(markdown, page, config, files):
    here = page.file.src_uri
    source = {site: repo for repo, site in PAGES.items()}.get(here, "docs/" + here)  # its place in the repository
    # A printed plan's rows are longer than the column: docs/extra.css wraps blocks of this class.
    markdown = markdown.replace("```text\nTraining plan\n", "```{.text .plan}\nTraining plan\n")
    return _LINK.sub(lambda link: _site_link(*link.groups(), source, here), markdown)


def _site_link(text: str, target: str, source: str, here: str) -> str:
    if re.match(r"\w+:|#", target):  # a URL, or an anchor on the same page
        return f"[{text}]({target})"
    path, hash_, anchor = target.partition("#")
    file = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    page = PAGES.get(file) or (file.removeprefix("docs/") if file.startswith("docs/") else None)
    if page is None:
        return f"`{file}`" if text.strip("`") == file else f"{text} (`{file}`)"
    return f"[{text}]({posixpath.relpath(page, posixpath.dirname(here) or '.')}{hash_}{anchor})"


def on_page_content(html, page, config, files):
    if page.file.src_uri == "index.md":  # a renamed README heading would leave a tutorial entry dangling
        anchors = {entry.id for top in page.toc for entry in [top, *top.children]}
        for title, anchor in TUTORIAL.items():
            if anchor not in anchors:
                log.warning(f"docs/hooks.py: the tutorial's {title!r} points at #{anchor}, not a README heading")
    return html
