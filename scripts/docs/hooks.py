"""MkDocs hooks for the documentation site (mkdocs.yml names this file).

`on_page_markdown` fills the root-namespace page (docs/reference/index.md) from the
code: the names `jaxnitro.__all__` holds, each linked to its entry on its subpackage's
page, and the names that moved off the root (`jaxnitro._MOVED`).

`on_post_build` fails the build, naming each offender, when a public name has no
docstring or no entry on a reference page. The public names are each documented
module's `__all__`: every subpackage that declares one (`jaxnitro.checkpoint`,
`jaxnitro.data`, ...), plus the `errors` and `watch` modules. Each such module needs a
page, docs/reference/<name>.md, and every name of its `__all__` an anchor
(`id="jaxnitro.<name>.<Name>"`) in that page's HTML. Every root name must be one of
those names, so it is documented on its subpackage's page.
"""

from __future__ import annotations

import html
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("errors", "watch")  # documented modules that are not subpackages


def documented_modules() -> list[str]:
    """Every module with a reference page: subpackages with `__all__`, plus MODULES."""
    import jaxnitro

    names = [
        info.name
        for info in pkgutil.iter_modules(jaxnitro.__path__)
        if info.ispkg
        and hasattr(importlib.import_module(f"jaxnitro.{info.name}"), "__all__")
    ]
    return sorted(names) + list(MODULES)


def home_of() -> dict[str, str]:
    """Public name -> the documented module that exports it."""
    homes: dict[str, str] = {}
    for sub in documented_modules():
        for name in importlib.import_module(f"jaxnitro.{sub}").__all__:
            homes.setdefault(name, sub)
    return homes


def summary(obj: Any) -> str:
    """The first paragraph of obj's docstring, on one line, pipes escaped."""
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split()).replace("|", "\\|")


def name_table(names: list[tuple[str, str]]) -> str:
    """A Markdown table: each name linked to its reference entry, with its summary."""
    import jaxnitro

    rows = ["| name | where it is documented | what it is |", "| --- | --- | --- |"]
    for name, sub in names:
        obj = getattr(importlib.import_module(f"jaxnitro.{sub}"), name)
        path = f"jaxnitro.{sub}.{name}"
        rows.append(f"| `{name}` | [`{path}`][{path}] | {summary(obj)} |")
    del jaxnitro
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != "reference/index.md":
        return markdown
    import jaxnitro

    homes = home_of()
    root = [n for n in jaxnitro.__all__ if n != "__version__"]
    missing = [n for n in root if n not in homes]
    if missing:
        raise PluginError(
            f"root names exported by no documented subpackage: {', '.join(missing)}; "
            "add each to its subpackage's __init__ (from .x import y as y, __all__)"
        )
    root_rows = sorted(((n, homes[n]) for n in root), key=lambda r: r[0].lower())
    moved = sorted(jaxnitro._MOVED.items(), key=lambda r: r[0].lower())
    markdown = markdown.replace("<!-- root-names -->", name_table(root_rows))
    return markdown.replace("<!-- moved-names -->", name_table(moved))


def problems(site_dir: Path) -> list[str]:
    """What makes the API reference incomplete: each message names the offender."""
    import griffe

    found: list[str] = []
    package = griffe.load("jaxnitro", search_paths=[str(ROOT / "src")])
    for sub in documented_modules():
        module = importlib.import_module(f"jaxnitro.{sub}")
        page = site_dir / "reference" / sub / "index.html"
        if not page.is_file():
            found.append(f"jaxnitro.{sub}: no reference page (docs/reference/{sub}.md)")
            continue
        anchors = {
            html.unescape(a) for a in re.findall(r'id="([^"]+)"', page.read_text())
        }
        for name in module.__all__:
            path = f"jaxnitro.{sub}.{name}"
            member = package[f"{sub}.{name}"]
            if not (member.docstring and member.docstring.value.strip()):
                found.append(f"{path}: public name without a docstring")
            if path not in anchors:
                found.append(f"{path}: no entry on reference/{sub}.md")
    return found


def on_post_build(config: Any, **kwargs: Any) -> None:
    found = problems(Path(config["site_dir"]))
    if found:
        raise PluginError("the API reference is incomplete:\n  " + "\n  ".join(found))
