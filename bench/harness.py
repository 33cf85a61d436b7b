"""What every benchmark here shares: a contender in a fresh process, timed; rounds interleaved; the table.

A benchmark compares streamdedup with a peer measured in the same run, on a
shared and noisy machine, so every figure it prints is a median over rounds
that take the contenders in turn, with the min-max beside it, and a ratio is
given twice: of the medians, and the median of the same-round ratios
(``paired``), which a slow minute affects less.

Run a benchmark from the repository's top folder as a module
(``python -m bench.offline``); each imports this as ``bench.harness``.

Every contender starts from the package's bytecode, as an installed package
does (pip compiles it at install, the container image too): ``interleaved``
compiles it first (``compile_package``). With an editable install and
``PYTHONDONTWRITEBYTECODE`` set, every process would otherwise compile our
modules from source at its start (0.2 to 0.5 s of CPU), which the peers,
installed packages, never pay.
"""

from __future__ import annotations

import compileall
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

__all__ = ["ROOT", "DedupRun", "dedup", "dedup_command", "timed", "child", "interleaved", "table", "median",
           "summary_rate"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class DedupRun:
    """One ``streamdedup dedup`` run: its wall time (process start to exit), documents, and what it left."""

    seconds: float
    documents: int
    state: str
    decisions_path: Optional[str]
    stdout: str = ""
    stderr: str = ""
    peak_rss_mib: Optional[float] = None

    @property
    def rate(self) -> float:
        return self.documents / self.seconds

    def decisions(self) -> list[dict]:
        with open(self.decisions_path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle]

    def index_bytes(self) -> int:
        """The size of the index's data file."""
        return os.path.getsize(os.path.join(self.state, "data.mdb"))

    def table_bytes(self) -> dict[str, int]:
        """Bytes each table of the index holds."""
        from streamdedup.store.index import Index, IndexSettings

        with Index(IndexSettings(path=self.state), None, readonly=True) as index:
            return index.database_bytes()


def dedup_command(path: str, state: str, settings: Iterable[str] = (), decisions: Optional[str] = None,
                  python: Sequence[str] = ("-m", "streamdedup")) -> list[str]:
    """``streamdedup dedup`` as a user runs it: ``settings`` are ``section.key=value`` (given with ``--set``) or
    flags (``--learn-first``); ``python``: how the interpreter starts the command."""
    command = [sys.executable, *python, "dedup", path, "--state", state]
    if decisions is not None:
        command += ["--decisions", decisions]
    for setting in settings:
        command += [setting] if setting.startswith("--") else ["--set", setting]
    return command


def dedup(path: str, state: str, settings: Iterable[str] = (), *, decisions: bool = True, documents: int = 0,
          env: Optional[dict] = None, cwd: Optional[str] = None, python: Sequence[str] = ("-m", "streamdedup"),
          peak_rss: bool = False, timeout: float = 24 * 3600) -> DedupRun:
    """Run ``streamdedup dedup`` in a fresh process into a new index at ``state``, and time it.

    ``documents``: how many the input holds (default: its lines). With
    ``peak_rss``, the largest resident size of the process, measured by GNU
    ``time`` (its page cache share of the mapped index included).
    """
    out = os.path.join(state, "decisions.jsonl") if decisions else None
    command = dedup_command(path, state, settings, out, python)
    os.makedirs(state, exist_ok=True)
    peak_file = os.path.join(state, "peak-rss")
    if peak_rss:
        command = ["/usr/bin/time", "-f", "%M", "-o", peak_file, *command]
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    if not documents:
        with open(path, "rb") as handle:
            documents = sum(1 for _ in handle)
    peak = None
    if peak_rss:
        with open(peak_file) as handle:
            peak = int(handle.read().split()[-1]) / 1024
    return DedupRun(seconds, documents, state, out, done.stdout, done.stderr, peak)


def summary_rate(summary: str) -> float:
    """The docs/s a ``dedup`` summary reports (its own clock: from the index open to the last commit)."""
    found = re.search(r"\(([\d,]+) docs/s", summary)
    if found is None:
        raise RuntimeError(f"no docs/s in the dedup summary:\n{summary}")
    return float(found.group(1).replace(",", ""))


def timed(command: Sequence[str], *, env: Optional[dict] = None, cwd: Optional[str] = None,
          timeout: float = 24 * 3600) -> float:
    """Seconds a program takes, from its start to its exit; it must succeed."""
    began = time.monotonic()
    subprocess.run(list(command), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                   cwd=cwd, timeout=timeout)
    return time.monotonic() - began


def child(module: str, *args: str, timeout: float = 24 * 3600) -> dict:
    """Run ``python -m MODULE --child ARGS`` from the repository's top folder, a fresh process for a contender
    measured inside Python; it prints its result as JSON on its last line."""
    done = subprocess.run([sys.executable, "-m", module, "--child", *args], capture_output=True, text=True,
                          check=True, cwd=ROOT, timeout=timeout)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compile_package(root: Path = ROOT) -> None:
    """Compile the package of the tree at ``root`` to bytecode where it is missing or out of date (its
    ``__pycache__`` folders, whatever ``PYTHONDONTWRITEBYTECODE`` says); say so when some could not be."""
    if not compileall.compile_dir(str(Path(root) / "streamdedup"), quiet=1):
        print(f"the bytecode of {root}/streamdedup could not all be written: its processes compile those modules "
              "at each start")


def interleaved(names: Sequence[str], rounds: int, measure: Callable[[str, int], float], *, alternate: bool = False,
                log: Optional[Callable[[str], None]] = print, unit: str = "docs/s") -> dict[str, list[float]]:
    """``measure(name, round)`` of every contender in every round, the contenders taken in turn (with
    ``alternate``, every other round in the reverse order, so none is always first). The package is compiled
    first (``compile_package``)."""
    compile_package()
    values: dict[str, list[float]] = {name: [] for name in names}
    for number in range(rounds):
        order = list(names) if not alternate or number % 2 == 0 else list(reversed(names))
        for name in order:
            value = measure(name, number)
            values[name].append(value)
            if log is not None:
                log(f"  round {number + 1}: {name:<30} {value:>12,.0f} {unit}")
    return values


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def table(values: dict[str, list[float]], base: Optional[str] = None, *, unit: str = "docs/s", name: str = "contender",
          ratio: str = "vs {base} (paired)", higher_is_better: bool = True,
          columns: Optional[dict[str, dict[str, str]]] = None) -> str:
    """A Markdown table: each contender's median, min-max, and its ratio to ``base`` (medians, then paired:
    the median of the same-round ratios), oriented so that above 1 means better than ``base``; ``columns``
    adds columns (column -> contender -> text)."""
    columns = columns or {}
    head = [name, f"median {unit}", "min-max"] + ([ratio.format(base=base)] if base else []) + list(columns)
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for contender, measured in values.items():
        cells = [contender, f"{median(measured):,.0f}", f"{min(measured):,.0f}-{max(measured):,.0f}"]
        if base:
            cells.append("" if contender == base else _ratio(measured, values[base], higher_is_better))
        cells += [columns[column].get(contender, "") for column in columns]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _ratio(measured: list[float], base: list[float], higher_is_better: bool) -> str:
    pairs = list(zip(measured, base))
    if higher_is_better:
        return f"{median(measured) / median(base):.2f}x ({median(m / b for m, b in pairs):.2f}x)"
    return f"{median(base) / median(measured):.2f}x ({median(b / m for m, b in pairs):.2f}x)"
