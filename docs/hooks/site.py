"""MkDocs hook: the benchmarks' figures on the pages that cite them, and README's links on the home page.

The pages link a figure where it lies in the repository (``../benchmarks/results/<run>/<figure>.png``),
so the links also work when a page is read on disk or on a forge. MkDocs only publishes files under
``docs/``: this hook adds the figures under ``benchmarks/results`` to the site (one copy, the one the
benchmark wrote) and points the pages' links at them. The home page is README.md (included by
``docs/index.md``): its links to the changelog and the licence go to their places on the site.
"""

from pathlib import Path

from mkdocs.structure.files import File

REPOSITORY = Path(__file__).resolve().parents[2]
FIGURES = "benchmarks/results"
FIGURE_SUFFIXES = {".png", ".svg", ".jpg"}
# README's links to files beside it (as the include rewrites them, from docs/) -> their place on the site
ROOT_LINKS = {"../CHANGELOG.md": "changelog.md", "../LICENSE": "LICENSE"}


def on_files(files, config):
    for path in sorted((REPOSITORY / FIGURES).rglob("*")):
        if path.suffix in FIGURE_SUFFIXES:
            uri = path.relative_to(REPOSITORY).as_posix()
            files.append(File(uri, str(REPOSITORY), config["site_dir"], config["use_directory_urls"]))
    files.append(File("LICENSE", str(REPOSITORY), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    # Pages are one folder below the repository; on the site the figures sit beside the pages.
    markdown = markdown.replace(f"](../{FIGURES}/", f"]({FIGURES}/")
    for link, target in ROOT_LINKS.items():
        markdown = markdown.replace(f"]({link})", f"]({target})")
    return markdown
