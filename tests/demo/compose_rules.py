"""The rules docker-compose.yml keeps, each a function listing what breaks it.

An empty list: the file keeps the rule. Returning problems instead of asserting
lets a test show that each rule catches a broken copy of the file as well as
passing the real one. The rules look at the file as a person wrote it (merge keys
resolved), with the project's own CLI parser and source as the reference.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import itertools
import re
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from spark_outbox.cli.main import build_parser

IMAGE = "spark-outbox:latest"
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
SOURCE_PACKAGES = ("dispatcher", "cli", "api", "spark_jobs")
SHELL_SEPARATORS = {"&&", "||", ";", "|", "&"}
SHELL_GROUPING = {"{", "}", "(", ")"}


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping.

    PyYAML (like Compose v1) keeps the last of two equal keys silently; Compose v2
    refuses the file. Keys brought in by a merge (``<<: *anchor``) may be
    overridden: only keys written in the same mapping count.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found the key {key!r} twice",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> dict[str, Any]:
    loaded = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    assert isinstance(loaded, dict)
    return loaded


def ours(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run this project's image (the others are postgres, prometheus)."""
    return {name: s for name, s in services.items() if s.get("image") == IMAGE}


def argv_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def outbox_commands(argv: list[str]) -> list[list[str]]:
    """The ``outbox`` invocations of a command: itself, or each one of an ``sh -c`` script."""
    if argv[:1] == ["outbox"]:
        return [argv]
    if argv[:2] != ["sh", "-c"] or len(argv) != 3:
        return []
    lexer = shlex.shlex(argv[2], posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    segments: list[list[str]] = [[]]
    for token in lexer:
        if token in SHELL_SEPARATORS:
            segments.append([])
        elif token not in SHELL_GROUPING:
            segments[-1].append(token)
    return [s for s in segments if s]


def command_problems(services: dict[str, Any]) -> list[str]:
    """Every command of our image is a CLI command that parses (or Spark's launcher)."""
    parser = build_parser()
    problems = []
    for name, service in ours(services).items():
        argv = argv_of(service)
        if not argv:
            problems.append(f"{name}: no command (the image's default only prints help)")
        elif argv[0] == "spark-class":
            problems.extend(f"{name}: {p}" for p in _spark_class_problems(argv))
        elif not (found := outbox_commands(argv)):
            problems.append(f"{name}: {argv[0]!r} is neither `outbox` nor `sh -c` over it")
        else:
            for command in found:
                if command[0] != "outbox":
                    problems.append(f"{name}: {command[0]!r} in its script is not `outbox`")
                elif error := _parse_error(parser, command[1:]):
                    problems.append(f"{name}: `{shlex.join(command)}`: {error}")
    return problems


def _parse_error(parser: Any, args: list[str]) -> str | None:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            if exc.code != 0:
                return stderr.getvalue().strip().splitlines()[-1]
    return None


def _spark_class_problems(argv: list[str]) -> list[str]:
    """The image's SPARK_HOME is the pyspark package: its launcher must be there."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return ["pyspark is not installed here, so spark-class cannot be checked"]
    launcher = Path(spec.origin).parent / "bin" / "spark-class"
    problems = [] if launcher.is_file() else [f"no {launcher}"]
    if len(argv) < 2 or not argv[1].startswith("org.apache.spark.deploy."):
        problems.append(f"spark-class runs {argv[1:2]}, not a Spark deploy daemon")
    return problems


def variables_the_code_reads(root: Path) -> set[str]:
    """Every ``OUTBOX_*`` name and ``DATABASE_URL`` written as a string in the source."""
    pattern = re.compile(r"[\"'](OUTBOX_[A-Z0-9_]+|DATABASE_URL)[\"']")
    return {
        match
        for package in SOURCE_PACKAGES
        for path in (root / package).rglob("*.py")
        for match in pattern.findall(path.read_text())
    }


def environment_problems(services: dict[str, Any], known: Iterable[str]) -> list[str]:
    """Every OUTBOX_* / DATABASE_URL variable set is one the code reads (a ``NAME_FILE``
    becomes ``NAME`` in docker/entrypoint.sh), and every ``--...-env VAR`` a command
    names is set for it."""
    known = set(known)
    problems = []
    for name, service in ours(services).items():
        env = service.get("environment") or {}
        for var in env:
            read_as = var.removesuffix("_FILE")
            if (read_as.startswith("OUTBOX_") or read_as == "DATABASE_URL") and (
                read_as not in known
            ):
                problems.append(f"{name}: {var} is set, and no code reads {read_as}")
        for command in outbox_commands(argv_of(service)):
            for option, value in itertools.pairwise(command):
                if option.endswith("-env") and value not in env and f"{value}_FILE" not in env:
                    problems.append(f"{name}: {option} {value}, and {value} is not set")
    return problems


def secret_problems(services: dict[str, Any]) -> list[str]:
    """No value on a command line that ps would show: no ``--secret VALUE``, no
    ``--smtp-password``, no variable expanded into an argument."""
    problems = []
    for name, service in ours(services).items():
        argv = argv_of(service)
        scripted = [a for c in outbox_commands(argv) for a in c] if argv[:1] == ["sh"] else []
        for arg in argv + scripted:
            if arg == "--secret" or arg.startswith(("--secret=", "--smtp-password=")):
                problems.append(f"{name}: {arg} puts a secret on the command line")
            if "$" in arg:
                problems.append(f"{name}: {arg!r} expands a variable into the command line")
    return problems


def depends_problems(services: dict[str, Any]) -> list[str]:
    """Every dependency exists, can be waited for as its condition says, and is
    started by the same ``up`` (its profiles are the dependent's too)."""
    problems = []
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        if isinstance(depends, list):
            depends = {target: {"condition": "service_started"} for target in depends}
        for target, how in depends.items():
            condition = how.get("condition", "service_started")
            needed = services.get(target)
            if needed is None:
                problems.append(f"{name}: depends on {target!r}, which is not a service")
                continue
            if condition not in CONDITIONS:
                problems.append(f"{name}: {target} with unknown condition {condition!r}")
            healthcheck = needed.get("healthcheck") or {}
            if condition == "service_healthy" and (not healthcheck or healthcheck.get("disable")):
                problems.append(f"{name}: waits for {target} to be healthy; it has no healthcheck")
            if condition == "service_completed_successfully" and needed.get("restart") != "no":
                problems.append(f"{name}: waits for {target} to complete; it restarts")
            if not set(needed.get("profiles") or []) <= set(service.get("profiles") or []):
                problems.append(f"{name}: {target} is behind profiles {needed['profiles']}")
    return problems


def healthcheck_problems(services: dict[str, Any]) -> list[str]:
    """A healthcheck in Python (``python -c CODE``) compiles."""
    problems = []
    for name, service in services.items():
        test = (service.get("healthcheck") or {}).get("test") or []
        if test[:3] == ["CMD", "python", "-c"]:
            try:
                compile(test[3], f"<{name} healthcheck>", "exec")
            except SyntaxError as exc:
                problems.append(f"{name}: healthcheck: {exc}")
    return problems
