"""The deployment files (Dockerfile, .dockerignore, docker-compose.yml) against the code they deploy.

No Docker engine needed: the files are parsed and checked against the settings classes, the CLI, the app's
routes and pyproject.toml, so that each test fails when a file drifts from the code it runs.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml  # a dependency of hivemind, so of every swarmhub install
from fastapi.testclient import TestClient
from pydantic import TypeAdapter
from pydantic_settings import BaseSettings
from sqlalchemy.engine import make_url
from starlette.routing import Mount

from swarmhub.server.app import create_app
from swarmhub.server.core.settings import Settings
from swarmhub.server.services import services as app_services
from swarmhub.worker.cli.main import main as cli
from swarmhub.worker.settings import WorkerSettings

if sys.version_info >= (3, 11):
    import tomllib
else:
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
# Variables the compose file passes before the code reads them: each must say so in a YAML comment, and the
# exemption must go (with the comment) once the code reads it.
PLANNED: dict[str, str] = {}  # variables the compose file sets ahead of the code: name -> the comment's words


# -- helpers ------------------------------------------------------------------------------------------------


def env_names(settings_class: type[BaseSettings]) -> dict[str, str]:
    """Environment variable (upper case) -> field, as pydantic-settings reads them for this class."""
    prefix = settings_class.model_config.get("env_prefix") or ""
    names = {}
    for name, info in settings_class.model_fields.items():
        aliases = [alias for alias in (info.validation_alias, info.alias) if isinstance(alias, str)]
        for env in aliases or [prefix + name]:  # an alias replaces the prefixed name
            names[env.upper()] = name
    return names


_VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>[A-Za-z_]\w*)")


def interpolate(value: str, host_env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err} and $VAR, against ``host_env``."""

    def substitute(match: re.Match[str]) -> str:
        name = match["name"] or match["bare"]
        current, op = host_env.get(name), match["op"]
        if op == ":-" and not current or op == "-" and current is None:
            return match["arg"]
        if op == ":?" and not current or op == "?" and current is None:
            raise AssertionError(f"the compose file requires {name}: {match['arg']}")
        return current or ""

    return _VARIABLE.sub(substitute, value.replace("$$", "\0")).replace("\0", "$")


def environment(service: dict[str, Any], host_env: dict[str, str] | None = None) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    host_env = host_env or {}
    # A variable without a value is passed through from the host's environment.
    return {k: interpolate(str(v), host_env) if v is not None else host_env.get(k, "") for k, v in env.items()}


def container_ports(service: dict[str, Any]) -> list[int]:
    ports = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports.append(int(entry["target"]))
        else:  # [IP:][HOST:]CONTAINER[/PROTOCOL]
            ports.append(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    return ports


def healthcheck_command(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    if isinstance(test, str):
        return test
    assert test[0] in ("CMD", "CMD-SHELL"), test
    return " ".join(test[1:])


def named_volume_mounts(compose: dict[str, Any], service: dict[str, Any]) -> dict[str, str]:
    """Container path -> named volume (declared at the top level) for a service's volumes."""
    mounts = {}
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            source, target = entry.get("source"), entry["target"]
        else:
            source, target = str(entry).split(":")[:2]
        if source in (compose.get("volumes") or {}):
            mounts[target] = source
    return mounts


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def dockerfile_stages() -> list[Stage]:
    """The Dockerfile's stages: (INSTRUCTION, arguments) with continuation lines joined, comments dropped."""
    stages: list[Stage] = []
    logical = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.strip().startswith("#"):
            continue  # also inside a continuation, as Docker does
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        if logical.strip():
            keyword, _, arguments = logical.strip().partition(" ")
            keyword, arguments = keyword.upper(), arguments.strip()
            if keyword == "FROM":
                words = arguments.split()
                name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
                stages.append(Stage(base=words[0], name=name))
            else:
                stages[-1].instructions.append((keyword, arguments))
        logical = ""
    return stages


def resolve_args(stage: Stage, upto: int, text: str) -> str:
    """Expand ${NAME} and $NAME with the stage's ARG defaults declared before instruction ``upto``."""
    values = {}
    for keyword, arguments in stage.instructions[:upto]:
        if keyword == "ARG" and "=" in arguments:
            name, value = arguments.split("=", 1)
            values[name.strip()] = value.strip().strip("\"'")
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m[1] or m[2], m[0]), text)


def workdir_at(stage: Stage, upto: int) -> PurePosixPath:
    workdir = PurePosixPath("/")
    for keyword, arguments in stage.instructions[:upto]:
        if keyword == "WORKDIR":
            workdir = workdir / arguments  # an absolute path replaces it
    return workdir


def copy_parts(arguments: str) -> tuple[dict[str, str], list[str], str]:
    """COPY's flags, sources and destination."""
    words = shlex.split(arguments)
    flags = {}
    while words and words[0].startswith("--"):
        name, _, value = words.pop(0)[2:].partition("=")
        flags[name] = value
    if words and words[0].startswith("["):
        words = json.loads(" ".join(words))
    return flags, words[:-1], words[-1]


def final_stage() -> Stage:
    return dockerfile_stages()[-1]


def find(stage: Stage, keyword: str, predicate: Any = lambda arguments: True) -> list[int]:
    return [i for i, (k, a) in enumerate(stage.instructions) if k == keyword and predicate(a)]


def exec_form(arguments: str) -> list[str]:
    assert arguments.startswith("["), f"use the exec (JSON) form, not a shell string: {arguments}"
    return json.loads(arguments)


def dockerignore_excludes(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (relative, POSIX) out of the build context: the last matching
    pattern wins, and a pattern that matches a parent folder matches everything in it."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        regex = ""
        for token in re.findall(r"\*\*/|\*\*|\*|\?|\[[^\]]*\]|[^*?\[]+", pattern.strip("/")):
            regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                token, token if token.startswith("[") else re.escape(token)
            )
        patterns.append((negate, re.compile(regex)))
    parts = path.split("/")
    excluded = False
    for negate, regex in patterns:
        if any(regex.fullmatch("/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            excluded = not negate
    return excluded


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


@pytest.fixture(scope="module")
def server_port(services: dict[str, Any]) -> int:
    ports = container_ports(services["server"])
    assert len(ports) == 1, f"the server publishes one port, not {ports}"
    return ports[0]


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def deployed_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    data = tmp_path_factory.mktemp("deployment")
    app = create_app(
        Settings(environment="test", data_dir=data, database_url=f"sqlite:///{data / 'db'}", swarm_enabled=False)
    )
    yield app
    app_services(app).engine.dispose()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No SWARMHUB_* variable of the machine running the tests leaks into a settings object."""
    for name in list(os.environ):
        if name.upper().startswith("SWARMHUB_"):
            monkeypatch.delenv(name)
    return monkeypatch


# -- docker-compose.yml ---------------------------------------------------------------------------------------


def test_compose_names_the_services_and_only_the_worker_is_optional(services: dict[str, Any]) -> None:
    assert {"postgres", "redis", "server", "worker"} <= set(services)
    assert services["postgres"]["image"].split(":")[0] == "postgres"
    assert services["redis"]["image"].split(":")[0] == "redis"
    assert "worker" in services["worker"].get("profiles", [])
    for name in ("postgres", "redis", "server"):
        assert not services[name].get("profiles"), f"{name} must start with a plain `docker compose up`"
    build = services["server"]["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    assert (COMPOSE_FILE.parent / context / "Dockerfile").is_file()


def test_backing_services_have_healthchecks_and_postgres_keeps_its_data(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    postgres = services["postgres"]
    check = healthcheck_command(postgres)
    assert "pg_isready" in check
    env = environment(postgres)
    assert env["POSTGRES_USER"] in check and env["POSTGRES_DB"] in check
    assert "/var/lib/postgresql/data" in named_volume_mounts(compose, postgres)
    assert "redis-cli ping" in healthcheck_command(services["redis"])


def test_server_waits_for_healthy_postgres_and_redis(services: dict[str, Any]) -> None:
    depends = services["server"]["depends_on"]
    assert isinstance(depends, dict), "the short list form of depends_on cannot wait for health"
    for name in ("postgres", "redis"):
        assert depends[name]["condition"] == "service_healthy"
        assert "healthcheck" in services[name]


def test_server_healthcheck_asks_healthz_on_the_mapped_port(
    services: dict[str, Any], server_port: int, deployed_app: Any
) -> None:
    check = healthcheck_command(services["server"])
    assert f"http://127.0.0.1:{server_port}/healthz" in check
    assert not re.search(r"\b(curl|wget)\b", check), "python:3.11-slim has neither curl nor wget"
    # The route the check asks exists and answers 200 while the database does.
    response = TestClient(deployed_app).get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_server_environment_is_read_by_settings(services: dict[str, Any], clean_env: pytest.MonkeyPatch) -> None:
    read = env_names(Settings)
    env = environment(services["server"])
    names = [name for name in env if name.upper().startswith("SWARMHUB_")]
    assert names
    lines = COMPOSE_FILE.read_text().splitlines()
    for name in names:
        if name.upper() in PLANNED:
            assert name.upper() not in read, f"Settings reads {name} now: drop its 'not read yet' comment and PLANNED"
            # its line or the comment lines right above it say what it waits for
            at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{name}:"))
            above = [line for line in lines[max(0, at - 3) : at + 1] if "#" in line]
            assert any(PLANNED[name.upper()] in line for line in above), f"mark {name} as planned in a comment"
            continue
        assert name.upper() in read, f"{name} is not a field of swarmhub.server.core.settings.Settings ({sorted(read)})"
    # ... and the values, with the defaults Compose fills in, make a valid Settings that holds them.
    for name, value in env.items():
        clean_env.setenv(name, value)
    settings = Settings()
    for name, value in env.items():
        if name.upper() in read:
            field_name = read[name.upper()]
            expected = TypeAdapter(Settings.model_fields[field_name].annotation).validate_python(value)
            assert getattr(settings, field_name) == expected, f"{name}={value!r} did not reach Settings.{field_name}"


def test_server_uses_the_postgres_service_and_a_volume_for_its_data(
    compose: dict[str, Any], services: dict[str, Any], clean_env: pytest.MonkeyPatch
) -> None:
    for name, value in environment(services["server"]).items():
        clean_env.setenv(name, value)
    settings = Settings()
    url = make_url(settings.database_url)
    postgres = environment(services["postgres"])
    assert url.drivername == "postgresql+psycopg"
    assert url.host == "postgres" and (url.port or 5432) == 5432
    assert (url.username, url.password, url.database) == (
        postgres["POSTGRES_USER"],
        postgres["POSTGRES_PASSWORD"],
        postgres["POSTGRES_DB"],
    )
    mounts = named_volume_mounts(compose, services["server"])
    assert str(settings.data_dir) in mounts, f"SWARMHUB_DATA_DIR={settings.data_dir} is not on a volume ({mounts})"


def test_server_swarm_peers_listen_beyond_the_container_loopback(
    services: dict[str, Any], clean_env: pytest.MonkeyPatch
) -> None:
    env = environment(services["server"])
    name = next(n for n, field_name in env_names(Settings).items() if field_name == "swarm_host")
    assert name in env, f"set {name}: the default (loopback) reaches no one outside the container"
    clean_env.setenv(name, env[name])
    assert not ipaddress.ip_address(Settings().swarm_host).is_loopback


def test_worker_joins_the_experiment_through_the_server_service(
    services: dict[str, Any], server_port: int, clean_env: pytest.MonkeyPatch
) -> None:
    worker = services["worker"]
    assert worker["depends_on"]["server"]["condition"] == "service_healthy"
    # Compose interpolates every service, active profile or not: `:?` here would break a plain `up`.
    assert ":?" not in json.dumps(worker)
    command = worker["command"] if isinstance(worker["command"], str) else shlex.join(worker["command"])
    args = shlex.split(interpolate(command, {"SWARMHUB_EXPERIMENT": "demo-digits"}))
    assert args[:2] == ["swarmhub", "join"] and "join" in cli.commands
    # the slug comes from SWARMHUB_EXPERIMENT, as `join`'s argument
    assert cli.commands["join"].make_context("join", args[2:]).params["slug"] == "demo-digits"

    read = env_names(WorkerSettings)
    env = environment(worker, {"SWARMHUB_TOKEN": "a-token"})
    for name in env:
        if name.upper().startswith("SWARMHUB_"):
            assert name.upper() in read, f"{name} is not read by swarmhub.worker.settings.WorkerSettings"
        clean_env.setenv(name, env[name])
    settings = WorkerSettings()
    assert settings.server == f"http://server:{server_port}"
    assert settings.token is not None and settings.token.get_secret_value() == "a-token"
    # The image's HEALTHCHECK asks the server's port, where a worker does not listen.
    assert worker.get("healthcheck", {}).get("disable") is True or worker["healthcheck"].get("test") == ["NONE"]


# -- Dockerfile ---------------------------------------------------------------------------------------------


def test_dockerfile_runs_the_server_on_the_port_compose_maps(server_port: int) -> None:
    stage = final_stage()
    (cmd,) = [a for k, a in stage.instructions if k == "CMD"]
    args = exec_form(cmd)
    assert args[:2] == ["swarmhub", "server"] and "server" in cli.commands
    params = cli.commands["server"].make_context("server", args[2:]).params
    assert params["port"] == server_port
    assert params["host"] == "0.0.0.0", "listen on the container's interfaces, not its loopback"
    assert str(server_port) in " ".join(a for k, a in stage.instructions if k == "EXPOSE").split()

    (healthcheck,) = [a for k, a in stage.instructions if k == "HEALTHCHECK"]
    probe = exec_form(healthcheck.split(" CMD ", 1)[1].strip())
    assert probe[0].startswith("python"), "python:3.11-slim has no curl: probe with python"
    assert f"http://127.0.0.1:{server_port}/healthz" in " ".join(probe)


def test_dockerfile_installs_cpu_torch_then_the_server_extra(pyproject: dict[str, Any]) -> None:
    stage = final_stage()
    assert stage.base.startswith("python:3.11-slim")
    assert "server" in pyproject["project"]["optional-dependencies"]
    runs = {i: resolve_args(stage, i, stage.instructions[i][1]) for i in find(stage, "RUN")}
    project = [i for i, run in runs.items() if re.search(r"pip install [\"']?\.\[server\][\"']?", run)]
    assert project, "the image installs the project with the `server` extra: pip install .[server]"
    torch = [i for i, run in runs.items() if re.search(r"pip install [\"']?torch\b", run)]
    assert torch and torch[0] < project[0], "torch comes first, so that pip keeps the CPU build"
    torch_run = runs[torch[0]]
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch_run.replace('"', "")
    makefile = re.search(r"^TORCH_SPEC \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert makefile and makefile[1] in torch_run, f"the image pins the Makefile's {makefile and makefile[1]}"
    # Node is only in a build stage: the final image neither starts from it nor installs it.
    assert "node" not in stage.base
    assert not any(re.search(r"\b(npm|nodejs)\b", run) for run in runs.values())


def test_dockerfile_vendors_uplot_where_the_installed_app_serves_it(
    pyproject: dict[str, Any], deployed_app: Any
) -> None:
    mounts = [r for r in deployed_app.routes if isinstance(r, Mount) and r.path == "/vendor/uplot"]
    if not mounts:
        pytest.skip("uPlot is not installed in this checkout (npm ci --prefix web): cannot see where the app looks")
    served = Path(mounts[0].app.directory).relative_to(Path(str(files("swarmhub.web"))))
    web_dir = pyproject["tool"]["setuptools"]["package-dir"]["swarmhub.web"]
    vendored = [f for f in pyproject["tool"]["setuptools"]["package-data"]["swarmhub.web"] if f.startswith("node_")]
    assert vendored and all(PurePosixPath(f).parent == PurePosixPath(served) for f in vendored), (
        f"pyproject's package-data must ship what the app serves from swarmhub.web/{served}"
    )

    stages = dockerfile_stages()
    final = stages[-1]
    (install,) = [i for i, (k, a) in enumerate(final.instructions) if k == "RUN" and ".[server]" in a]
    source_tree = workdir_at(final, install)
    wanted = source_tree / web_dir / served
    copies = []
    for i in find(final, "COPY"):
        flags, sources, dest = copy_parts(final.instructions[i][1])
        if "from" in flags and i < install:
            copies.append((flags["from"], sources, workdir_at(final, i) / dest))
    supplying = [c for c in copies if c[2] == wanted or c[2] in wanted.parents]
    assert supplying, f"copy {web_dir}/{served} from the npm stage to {wanted} before `pip install .[server]`"
    stage_name, sources, dest = supplying[-1]
    (builder,) = [s for s in stages if s.name == stage_name]
    assert any(f"{web_dir}/package-lock.json" in a for k, a in builder.instructions if k == "COPY")
    npm = find(builder, "RUN", lambda a: "npm ci" in a)
    assert npm, f"stage {stage_name} installs the locked packages with npm ci"
    # what lands at `wanted` is the folder npm filled in the build stage
    assert PurePosixPath(sources[0]) / wanted.relative_to(dest) == workdir_at(builder, npm[0]) / web_dir / served


def test_dockerfile_runs_as_a_user_outside_the_source_tree() -> None:
    stage = final_stage()
    users = [a for k, a in stage.instructions if k == "USER"]
    assert users, "the image must not run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    # `python -m swarmhub.server.swarm.bootstrap_peer` puts the working directory first on sys.path: the source tree's
    # swarmhub/ folder (no server/ in it) would shadow the installed package.
    copies = [copy_parts(stage.instructions[i][1]) + (i,) for i in find(stage, "COPY")]
    (tree,) = [workdir_at(stage, i) / dest for flags, sources, dest, i in copies if sources == ["."]]
    runtime = workdir_at(stage, len(stage.instructions))
    assert runtime != tree and tree not in runtime.parents


def test_dockerfile_env_names_settings_fields() -> None:
    read = env_names(Settings)
    names = []
    for keyword, arguments in final_stage().instructions:
        if keyword == "ENV":
            names += [word.split("=", 1)[0] for word in shlex.split(arguments) if "=" in word]
    for name in names:
        if name.startswith("SWARMHUB_"):
            assert name in read, f"the image sets {name}, which Settings does not read"


# -- .dockerignore ------------------------------------------------------------------------------------------


def test_dockerignore_keeps_the_build_inputs_and_drops_local_state(pyproject: dict[str, Any]) -> None:
    setuptools = pyproject["tool"]["setuptools"]
    needed = ["pyproject.toml", pyproject["project"]["readme"]]
    for package, folder in setuptools["package-dir"].items():
        needed.append(f"{folder}/__init__.py")
        for pattern in setuptools.get("package-data", {}).get(package, []):
            if not pattern.startswith("node_modules/"):  # those come from the npm stage
                needed += [p.relative_to(ROOT).as_posix() for p in (ROOT / folder).glob(pattern)]
    for stage in dockerfile_stages():
        for i in find(stage, "COPY", lambda a: "--from" not in a):
            needed += [s for s in copy_parts(stage.instructions[i][1])[1] if s != "."]
    kept_out = [path for path in needed if dockerignore_excludes(path)]
    assert not kept_out, f".dockerignore drops files the build needs: {kept_out}"
    for path in (".venv/bin/python", ".git/HEAD", "web/node_modules/uplot/package.json", "build/lib/x.py"):
        assert dockerignore_excludes(path), f".dockerignore should keep {path} out of the image"
    assert dockerignore_excludes("server/__pycache__/app.cpython-311.pyc")


def _requirement_names(lines: list[str], python: str = "3.12") -> set[str]:
    """Normalized names of the requirements that apply to ``python`` (extras' own requirements left out)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    names = set()
    for line in lines:
        requirement = Requirement(line)
        environment = {"python_version": python, "python_full_version": f"{python}.0", "extra": ""}
        if requirement.marker is None or requirement.marker.evaluate(environment):
            names.add(canonicalize_name(requirement.name))
    return names


def test_the_gpu_check_carries_every_runtime_need_its_image_lacks(pyproject: dict[str, Any]) -> None:
    """`bench/gpu/check.sh` installs swarmhub on a GPU machine that reaches no package index: the wheels of
    `bench/gpu/requirements.txt`, with --no-deps, over the image's own packages (`bench/gpu/image-packages.txt`). A
    need added to pyproject.toml (the worker's, the server extra's) or one of hivemind 1.1.12's that is in neither
    would break the check there: each is pinned or in the image, but those the server imports only where they are
    configured (redis, psycopg)."""
    from importlib.metadata import requires

    from packaging.utils import canonicalize_name

    gpu = ROOT / "bench" / "gpu"
    pins = [line for line in (gpu / "requirements.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert all("==" in line for line in pins)
    pinned = {canonicalize_name(line.split("==", 1)[0]) for line in pins}
    image = {
        canonicalize_name(name)
        for line in (gpu / "image-packages.txt").read_text().splitlines()
        if not line.startswith("#")
        for name in line.split()
    }
    project = pyproject["project"]
    needs = _requirement_names(project["dependencies"]) | _requirement_names(project["optional-dependencies"]["server"])
    needs |= _requirement_names(requires("hivemind") or [])
    configured_only = {
        "redis",
        "psycopg",
    }  # server/http/ratelimit.py, server/live/channels.py; SQLAlchemy's PostgreSQL dialect
    missing = needs - pinned - image - configured_only - {"swarmhub"}
    assert not missing, f"pin these in bench/gpu/requirements.txt (bash bench/gpu/wheels.sh fetches them): {missing}"
    assert "hivemind" in pinned and "torch" in image
