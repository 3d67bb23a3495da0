"""What a volunteer is told when something fails: one line that says what to do next, and a documented exit code
(``ExitCode``, listed in ``swarmhub --help``). Every command renders a :class:`WorkerError` that way
(``commands.CommandGroup``), never a traceback."""

from __future__ import annotations

from enum import IntEnum

# What a server command says where the server's package or its web stack is not installed (``swarmhub server``,
# ``admin`` and ``demo`` on a volunteer's worker).
SERVER_EXTRA_HINT = "The server needs the server extra: pip install 'swarmhub[server]'"


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    AUTH = 3
    NOT_FOUND = 4
    UNREACHABLE = 5
    NOT_ACCEPTING = 6
    CLOCK = 7
    REMOVED = 8
    UPGRADE = 9  # the hub's swarm needs a newer swarmhub than this one
    INTERRUPTED = 130
    TERMINATED = 143


# What the server refuses for good while a worker trains: the volunteer's login revoked or expired (401) or not
# allowed (403), the volunteer removed by the organizer, the experiment no longer running (409), or this worker too
# old for the hub's swarm (426). Asking again changes nothing, and training on would last only until the peer's swarm
# token expires, after which the other peers refuse it and its compute is wasted: the worker stops with the refusal.
FINAL_REFUSALS = frozenset({ExitCode.AUTH, ExitCode.NOT_ACCEPTING, ExitCode.REMOVED, ExitCode.UPGRADE})


class WorkerError(Exception):
    """A failure the volunteer can act on: ``message`` says what to do next, ``exit_code`` is documented."""

    def __init__(self, message: str, exit_code: int = ExitCode.ERROR):
        super().__init__(message)
        self.message = message
        self.exit_code = int(exit_code)


def not_logged_in(server: str | None = None) -> WorkerError:
    where = server or "URL"
    return WorkerError(f"Not logged in: run `swarmhub login --server {where}`", ExitCode.AUTH)


def token_rejected() -> WorkerError:
    return WorkerError("Your token was rejected (revoked or expired): run `swarmhub login` again", ExitCode.AUTH)


def unknown_experiment(slug: str, server: str) -> WorkerError:
    return WorkerError(
        f"No experiment {slug!r} on {server}: run `swarmhub experiments` to list them", ExitCode.NOT_FOUND
    )


def upgrade_required(detail: str) -> WorkerError:
    """The hub's answer 426: its swarm speaks a newer protocol than this worker (``detail`` is the server's line,
    which says to upgrade)."""
    return WorkerError(
        detail
        or "The hub's swarm needs a newer swarmhub: upgrade with `swarmhub upgrade` (the worker the hub serves), "
        "then join again",
        ExitCode.UPGRADE,
    )


def not_accepting(slug: str, status: str) -> WorkerError:
    return WorkerError(
        f"Experiment {slug!r} is {status}: the organizer is not accepting volunteers now", ExitCode.NOT_ACCEPTING
    )


def normalize_server_url(url: str) -> str:
    """``https://host/`` -> ``https://host``; refuse anything that is not http(s)."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
        raise WorkerError(
            f"Server URL {url!r} must start with http:// or https:// (for example http://127.0.0.1:8000)",
            ExitCode.USAGE,
        )
    return url


def removed(slug: str) -> WorkerError:
    return WorkerError(
        f"You were removed from {slug!r} by its organizer: this machine no longer trains it", ExitCode.REMOVED
    )


MAX_CLOCK_SKEW_SECONDS = 30.0


def check_clock(server_time: float, sent_at: float, received_at: float) -> None:
    """Refuse to start when this machine's clock is over 30 s off the server's: swarm tokens and the swarm's
    records (progress, roster) expire by each peer's own clock, so such a worker could not take part anyway."""
    skew = (sent_at + received_at) / 2 - server_time
    if abs(skew) > MAX_CLOCK_SKEW_SECONDS:
        direction = "ahead of" if skew > 0 else "behind"
        raise WorkerError(
            f"This machine's clock is {abs(skew):.0f} s {direction} the server's: turn on automatic time sync "
            "(for example `sudo timedatectl set-ntp true`), then join again",
            ExitCode.CLOCK,
        )
