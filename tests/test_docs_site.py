"""The documentation site: built in strict mode, every example on it run with its output checked, looked at in
a browser.

Examples are the ``console`` blocks (``$ command`` lines, each followed by
the output it must print: stdout, then stderr) and the ``pycon`` blocks
(doctest sessions) of every page, and of README.md. A page's examples run
in order in one fresh folder, with the project's ``streamdedup`` on PATH.
Outputs are compared as doctest compares them: runs of spaces are one,
``...`` stands for anything. ``bash`` blocks are synopses (a broker, a
cluster, an orchestrator), not examples.
"""

from __future__ import annotations

import doctest
import http.server
import io
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from chromium import chromium_binary, render
from conftest import ROOT

pytestmark = pytest.mark.system  # mkdocs, the examples' commands and Chromium are processes

DOCS = ROOT / "docs"
PAGES = sorted((DOCS / "pages").glob("*.md"))
SITE = ROOT / "build" / "docs-test"
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.M | re.S)


def _console_steps(block: str) -> list[tuple[str, str]]:
    """(command, expected output) of each ``$`` line of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return [(command, "\n".join(out) + "\n" if out else "") for command, out in steps]


def _with_examples():
    return [path for path in [*PAGES, ROOT / "README.md"]
            if _blocks(path.read_text(), "console") or _blocks(path.read_text(), "pycon")]


@pytest.fixture(scope="module")
def site():
    """The site built by ``make docs``'s command, strict: a broken link, anchor or reference fails."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(DOCS / "mkdocs.yml"),
                             "--site-dir", str(SITE)], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert result.returncode == 0, result.stderr
    return SITE


def test_the_site_builds_strict_with_every_page_and_the_generated_references(site):
    for page in PAGES:
        assert (site / page.with_suffix(".html").name).exists(), page.name
    configuration = (site / "configuration.html").read_text()
    from streamdedup.config import SECTIONS

    for section, cls in SECTIONS.items():
        for name in cls.__dataclass_fields__:
            assert f"{section}.{name}" in configuration, f"{section}.{name} is missing from the reference"
    api = (site / "api.html").read_text()
    assert "add_many" in api and "Decision" in api  # the reference made from the docstrings


def test_a_broken_link_fails_the_build(tmp_path):
    """Strict mode is what catches drift: the same site with one link to a page that does not exist fails."""
    copy = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(DOCS), str(copy)], check=True)
    page = copy / "pages" / "index.md"
    page.write_text(page.read_text() + "\nSee [the missing page](missing.md).\n")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(copy / "mkdocs.yml"),
                             "--site-dir", str(tmp_path / "site")], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert result.returncode != 0 and "missing.md" in result.stderr


@pytest.mark.parametrize("page", _with_examples(), ids=lambda p: p.name)
def test_every_example_runs_and_prints_what_the_page_shows(page, tmp_path):
    text = page.read_text()
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    checker = doctest.OutputChecker()
    for block in _blocks(text, "console"):
        for command, expected in _console_steps(block):
            done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, env=env,
                                  timeout=300)
            assert done.returncode == 0, f"$ {command}\n{done.stderr}"
            got = done.stdout + done.stderr
            assert checker.check_output(expected, got, FLAGS), f"$ {command}\nexpected:\n{expected}\ngot:\n{got}"
    for number, block in enumerate(_blocks(text, "pycon")):
        test = doctest.DocTestParser().get_doctest(block, {}, f"{page.name}[{number}]", str(page), 0)
        runner = doctest.DocTestRunner(optionflags=FLAGS)
        here = os.getcwd()
        os.chdir(tmp_path)
        try:
            report = io.StringIO()
            runner.run(test, out=report.write)
        finally:
            os.chdir(here)
        assert runner.failures == 0, report.getvalue()


def test_the_example_check_catches_a_wrong_output(tmp_path):
    """An example whose shown output is not what it prints fails."""
    checker = doctest.OutputChecker()
    done = subprocess.run(["bash", "-c", "echo kept 839"], capture_output=True, text=True)
    assert checker.check_output("kept 839\n", done.stdout, FLAGS)
    assert not checker.check_output("kept 840\n", done.stdout, FLAGS)


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on loopback (as a documentation host serves it; search needs a server)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(site), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("name", ["index.html", "getting-started.html", "api.html", "configuration.html"])
def test_pages_render_in_a_browser_without_errors_or_outside_requests(served, name):
    if chromium_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium on CI: `make test` runs deploy/report/install-chromium.sh first")
        pytest.skip("no chromium: run deploy/report/install-chromium.sh (make test does)")
    from PIL import Image

    rendered = render(f"{served}/{name}")
    assert rendered.console_errors == []
    assert all(url.startswith((served, "data:")) for url in rendered.requested_urls), rendered.requested_urls
    image = Image.open(io.BytesIO(rendered.png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    width, height = image.size
    assert len(colours) > 100  # text and the theme's colours antialiased; a blank page has a handful
    white = max((count for count, colour in colours if colour == (255, 255, 255)), default=0)
    assert white < 0.98 * width * height
