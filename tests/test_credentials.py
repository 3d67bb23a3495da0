"""The volunteer's stored login: file modes, environment overrides, logout, and a token that never shows.

CLI behaviour is checked through click's runner with the real commands. A server that is down is a real
outside condition: 127.0.0.1:9 (discard) refuses connections.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from pydantic import SecretStr

from swarmhub.worker.cli.main import main
from swarmhub.worker.client import ExitCode
from swarmhub.worker.credentials import (
    StoredCredentials,
    credentials_path,
    delete_credentials,
    load_credentials,
    resolve_credentials,
    store_credentials,
)
from swarmhub.worker.settings import WorkerSettings
from swarmhub.worker.swarm import access as swarm_access

TOKEN = "shh-4d1f9c0e7b2a-secret-token"
DOWN = "http://127.0.0.1:9"  # nothing listens there: connection refused


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated config folder, and no SWARMHUB_* variables from the developer's shell."""
    for name in list(os.environ):
        if name.startswith("SWARMHUB_"):
            monkeypatch.delenv(name)
    path = tmp_path / "config" / "swarmhub"
    monkeypatch.setenv("SWARMHUB_CONFIG_DIR", str(path))
    monkeypatch.setenv("SWARMHUB_STATE_DIR", str(tmp_path / "state"))
    return path


@pytest.fixture(params=[0o022, 0o077, 0o000], ids=["umask022", "umask077", "umask000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def stored(server: str = DOWN) -> StoredCredentials:
    return StoredCredentials(server=server, token=SecretStr(TOKEN), username="alice")


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input)


def test_file_is_0600_in_a_0700_folder_whatever_the_umask(config_dir: Path, umask: int) -> None:
    path = store_credentials(config_dir, stored())
    assert path == credentials_path(config_dir)
    assert mode(path) == 0o600
    assert mode(config_dir) == 0o700
    # Replacing it keeps the mode and leaves no temporary file behind.
    store_credentials(config_dir, stored("http://other:8000"))
    assert mode(path) == 0o600
    assert sorted(p.name for p in config_dir.iterdir()) == ["credentials.json"]
    loaded = load_credentials(config_dir)
    assert loaded is not None and loaded.server == "http://other:8000"
    assert loaded.token.get_secret_value() == TOKEN
    assert TOKEN not in repr(loaded)


def test_a_leftover_temp_file_with_loose_permissions_is_not_reused(config_dir: Path) -> None:
    config_dir.mkdir(parents=True)
    leftover = config_dir / f".credentials.json.{os.getpid()}.tmp"
    leftover.write_text("old")
    leftover.chmod(0o644)
    assert mode(store_credentials(config_dir, stored())) == 0o600


def test_settings_follow_xdg_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SWARMHUB_CONFIG_DIR", "SWARMHUB_SERVER", "SWARMHUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert WorkerSettings().config_dir == tmp_path / "xdg" / "swarmhub"
    monkeypatch.setenv("SWARMHUB_SERVER", "https://swarm.example.org/")
    monkeypatch.setenv("SWARMHUB_TOKEN", "  ")
    settings = WorkerSettings()
    assert settings.server == "https://swarm.example.org"
    assert settings.token is None  # a blank variable does not count


def test_env_vars_override_the_file(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store_credentials(config_dir, stored("http://stored:8000"))
    creds = resolve_credentials(WorkerSettings())
    assert (creds.server, creds.username, creds.source) == ("http://stored:8000", "alice", "file")
    assert creds.token is not None and creds.token.get_secret_value() == TOKEN

    monkeypatch.setenv("SWARMHUB_TOKEN", "from-env")
    creds = resolve_credentials(WorkerSettings())
    assert creds.token is not None and creds.token.get_secret_value() == "from-env"
    assert (creds.server, creds.source) == ("http://stored:8000", "env")

    monkeypatch.setenv("SWARMHUB_SERVER", "http://elsewhere:9000")
    assert resolve_credentials(WorkerSettings()).server == "http://elsewhere:9000"

    # A stored token is never sent to a different server named by SWARMHUB_SERVER.
    monkeypatch.delenv("SWARMHUB_TOKEN")
    creds = resolve_credentials(WorkerSettings())
    assert creds.server == "http://elsewhere:9000" and creds.token is None


def test_whoami_when_not_logged_in(config_dir: Path) -> None:
    result = run("whoami")
    assert result.exit_code == ExitCode.AUTH == 3
    assert result.output.splitlines() == ["Error: Not logged in: run `swarmhub login --server URL`"]


def test_join_without_login_is_one_line(config_dir: Path) -> None:
    result = run("join", "x")
    assert result.exit_code == ExitCode.AUTH
    assert result.output.splitlines() == ["Error: Not logged in: run `swarmhub login --server URL`"]
    assert "Traceback" not in result.output


def test_logout_deletes_the_file_even_when_the_server_is_down(config_dir: Path) -> None:
    store_credentials(config_dir, stored())
    result = run("logout")
    assert result.exit_code == 0, result.output
    assert not credentials_path(config_dir).exists()
    assert "could not revoke the token on the server" in result.output
    assert "credentials removed from this machine" in result.output
    assert TOKEN not in result.output
    assert run("logout").output.strip() == "Not logged in: nothing to remove."
    assert delete_credentials(config_dir) is False


def test_token_never_appears_in_cli_output(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store_credentials(config_dir, stored())
    outputs = []
    for args in (["whoami"], ["experiments"], ["join", "digits-demo"]):
        result = run(*args)
        assert result.exit_code == ExitCode.UNREACHABLE, result.output
        assert result.output.splitlines() == [
            f"Error: Cannot reach {DOWN}: is the server running? check --server or SWARMHUB_SERVER"
        ]
        outputs.append(result.output)
    login = run("login", "--server", DOWN, "--with-token", input=TOKEN + "\n")
    assert login.exit_code == ExitCode.UNREACHABLE
    outputs.append(login.output)
    monkeypatch.setenv("SWARMHUB_TOKEN", TOKEN)
    outputs.append(run("whoami").output)
    assert not any(TOKEN in output for output in outputs)


def test_usage_errors(config_dir: Path) -> None:
    assert run("login").exit_code == ExitCode.USAGE  # no server anywhere
    bad = run("login", "--server", "ftp://example.org", "--with-token", input="x\n")
    assert bad.exit_code == ExitCode.USAGE
    assert bad.output.startswith("Error: Server URL 'ftp://example.org' must start with http:// or https://")
    empty = run("login", "--server", DOWN, "--with-token", input="\n")
    assert empty.exit_code == ExitCode.USAGE and "No token on stdin" in empty.output
    assert run("join", "x", "--device", "tpu").exit_code == ExitCode.USAGE  # click's own usage error


def test_one_peer_key_per_user_and_experiment_kept_across_runs(config_dir: Path) -> None:
    """`join` takes its hivemind identity (and the key its swarm tokens bind) from ``identity_path``: the same
    key on every run of one user in one experiment, so its work stays attributable; another experiment, user or
    server gets another key."""
    settings = WorkerSettings()

    def peer(server: str, username: str, slug: str) -> str:
        key = swarm_access.load_or_create_identity(settings.identity_path(server, username, slug))
        return swarm_access.peer_id_for_public_key(key.get_public_key().to_bytes())

    first = peer("http://127.0.0.1:8000", "alice", "sahajbert")
    assert peer("http://127.0.0.1:8000", "alice", "sahajbert") == first  # a restart: the same peer ID
    assert WorkerSettings().identity_path("http://127.0.0.1:8000", "alice", "sahajbert").stat().st_mode & 0o077 == 0
    others = {
        peer("http://127.0.0.1:8000", "alice", "digits"),
        peer("http://127.0.0.1:8000", "bob", "sahajbert"),
        peer("http://127.0.0.1:9000", "alice", "sahajbert"),
    }
    assert len(others) == 3 and first not in others
