"""The commands of the background worker: ``swarmhub service install|start|stop|status|uninstall`` and
``swarmhub run-service`` (what the installed service runs; see :mod:`swarmhub.worker.service.runner`)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import click

from swarmhub.common.choice import JoinableExperiment
from swarmhub.worker.client import USER_AGENT, ApiClient, ExitCode, WorkerError, not_logged_in
from swarmhub.worker.credentials import resolve_credentials
from swarmhub.worker.service.limits import config_path, load_config, validate_config
from swarmhub.worker.service.runner import Runner, default_conditions, join_command
from swarmhub.worker.service.state import ServiceState, read_state
from swarmhub.worker.service.units import Outcome, ServiceManager, swarmhub_executable
from swarmhub.worker.settings import WorkerSettings
from swarmhub.worker.transport import insecure_option, require_encryption

logger = logging.getLogger("swarmhub.worker.service")


def state_dir(settings: WorkerSettings) -> Path:
    return settings.state_dir / "service"


def _settings() -> WorkerSettings:
    from swarmhub.worker.cli.commands import worker_settings as settings

    return settings()


def joinable_fetcher(settings: WorkerSettings, insecure: bool) -> Callable[[], list[JoinableExperiment]]:
    """Lists the experiments the volunteer may join (``--any``), with the credentials as they are at each call."""

    def fetch() -> list[JoinableExperiment]:
        creds = resolve_credentials(settings)
        if creds.token is None or creds.server is None:
            raise not_logged_in(creds.server)
        server = require_encryption(creds.server, insecure)
        with ApiClient(server, creds.token.get_secret_value(), user_agent=USER_AGENT) as client:
            return client.joinable()

    return fetch


def _report(outcome: Outcome, done: str) -> None:
    if outcome.failed:
        raise WorkerError(f"{outcome.failed}: fix that, then run the command again", ExitCode.ERROR)
    if outcome.todo:
        click.echo(f"{done}; systemd's user manager is not reachable from here, so run:")
        for argv in outcome.todo:
            click.echo("  " + " ".join(argv))
    else:
        click.echo(f"{done}.")


@click.group()
def service() -> None:
    """Run the worker in the background within your limits (systemd user service or launchd agent).

    \b
    Limits: config.toml in swarmhub's config folder (see `swarmhub service status` for its path).
    """


@service.command()
def install() -> None:
    """Write the service (and enable it where the service manager is reachable)."""
    settings = _settings()
    config = load_config(settings.config_dir)  # a bad config.toml is reported now, not in the journal later
    if not config.experiments and not config.any:
        click.echo(
            f'Note: no experiments chosen yet: add experiments = ["SLUG"] (or "any") to '
            f"{config_path(settings.config_dir)}",
            err=True,
        )
    if resolve_credentials(settings).token is None:
        click.echo("Note: not logged in: run `swarmhub login` before starting the service.", err=True)
    try:
        executable = swarmhub_executable()
    except FileNotFoundError as exc:
        raise WorkerError(str(exc), ExitCode.ERROR) from None
    manager = ServiceManager(settings)
    outcome = manager.install(executable)
    _report(outcome, f"Installed {outcome.path}")
    click.echo("Start it with `swarmhub service start`; `swarmhub service status` shows what it does.")


@service.command()
def start() -> None:
    """Start the installed service."""
    manager = ServiceManager(_settings())
    if not manager.path.exists():
        raise WorkerError("The service is not installed: run `swarmhub service install`", ExitCode.USAGE)
    _report(manager.control("start"), "Started the service")


@service.command()
def stop() -> None:
    """Stop the service (its worker leaves the swarm cleanly)."""
    manager = ServiceManager(_settings())
    if not manager.path.exists():
        raise WorkerError("The service is not installed: run `swarmhub service install`", ExitCode.USAGE)
    _report(manager.control("stop"), "Stopped the service")


@service.command()
def uninstall() -> None:
    """Stop and remove the service."""
    manager = ServiceManager(_settings())
    existed = manager.path.exists()
    outcome = manager.uninstall()
    _report(outcome, f"Removed {outcome.path}" if existed else f"No service installed at {outcome.path}")


def _ago(moment: datetime) -> str:
    seconds = max(0.0, (datetime.now(timezone.utc) - moment).total_seconds())
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC ({seconds:.0f} s ago)"


def render_status(state: ServiceState | None, manager_state: str | None, installed: bool, config_file: Path) -> str:
    lines = [
        "service: "
        + ("installed" if installed else "not installed")
        + (f" ({manager_state})" if manager_state else "")
        + f"; limits in {config_file}"
    ]
    if state is None:
        lines.append("No state recorded yet: the service has not run on this machine.")
        return "\n".join(lines)
    what = state.state + (f": {state.reason}" if state.reason else "")
    lines.append(f"state: {what}")
    if state.experiment:
        lines.append(f"experiment: {state.experiment}")
        if state.chosen:
            lines.append(f"chosen: {state.chosen}")
    p = state.progress
    if p is not None:
        lines.append(
            f"step: {p.step:,} | {p.samples:,} samples | {p.samples_per_second:,.1f} samples/s | loss {p.loss:.4f}"
            f" | {p.peers} peers"
        )
        acked = _ago(p.last_ack_at) if p.last_ack_at else "none yet"
        unsent = f"; {p.unacked_reports} not yet acknowledged" if p.unacked_reports is not None else ""
        lines.append(f"last report acknowledged: {acked}{unsent}")
    if state.restarts:
        lines.append(f"restarts: {state.restarts} (last exit code {state.last_exit_code})")
    lines.append(f"updated at: {_ago(state.updated_at)}")
    return "\n".join(lines)


@service.command()
def status() -> None:
    """Show what the background worker is doing: running or paused (and why), its step and throughput."""
    settings = _settings()
    manager = ServiceManager(settings)
    state = read_state(state_dir(settings) / "state.json")
    click.echo(render_status(state, manager.manager_state(), manager.path.exists(), config_path(settings.config_dir)))


@click.command("run-service")
@click.option("--experiment", "experiments", multiple=True, metavar="SLUG", help="Join this (repeatable)")
@click.option("--any", "any_experiment", is_flag=True, default=None, help="Join the experiment that needs peers most")
@click.option("--cpu-threads", type=int, help="CPU threads for training")
@click.option("--gpu-memory-fraction", type=float, help="Largest share of GPU memory for training")
@click.option("--hours", metavar="HH:MM-HH:MM", help="Train only within this daily window of local time")
@click.option("--pause-on-battery/--no-pause-on-battery", default=None, help="Pause while on battery")
@click.option("--pause-when-busy/--no-pause-when-busy", default=None, help="Pause while other programs load the CPU")
@click.option("--busy-threshold", type=float, help="Other programs' share of the CPU that counts as busy")
@click.option("--poll", type=click.FloatRange(min=0.5), default=5.0, show_default=True, help="Seconds between checks")
@click.option(
    "--settle",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds a cleared pause condition must last",
)
@click.option("--listen", "listen", multiple=True, metavar="MADDR", help="Passed to `join --listen` (repeatable)")
@insecure_option
@click.option("--power-supply-root", type=click.Path(file_okay=False, path_type=Path), hidden=True)
def run_service(
    experiments: Sequence[str],
    any_experiment: bool | None,
    cpu_threads: int | None,
    gpu_memory_fraction: float | None,
    hours: str | None,
    pause_on_battery: bool | None,
    pause_when_busy: bool | None,
    busy_threshold: float | None,
    poll: float,
    settle: float,
    listen: Sequence[str],
    insecure: bool,
    power_supply_root: Path | None,
) -> None:
    """Train in the foreground within the limits of config.toml (what the installed service runs)."""
    settings = _settings()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a journal line per request for `any`
    config = load_config(settings.config_dir)
    flags = {
        "experiments": list(experiments) or None,
        "any": any_experiment or None,
        "cpu_threads": cpu_threads,
        "gpu_memory_fraction": gpu_memory_fraction,
        "hours": hours,
        "pause_on_battery": pause_on_battery,
        "pause_when_busy": pause_when_busy,
        "busy_threshold": busy_threshold,
    }
    if experiments and any_experiment:
        raise WorkerError("run-service: pass either --experiment SLUG or --any, not both", ExitCode.USAGE)
    chosen = {k: v for k, v in flags.items() if v is not None}
    merged = config.model_dump(exclude_unset=True)
    if "experiments" in chosen or "any" in chosen:  # a flag that chooses replaces the file's way of choosing
        merged.pop("experiments", None)
        merged.pop("any", None)
    config = validate_config({**merged, **chosen}, "run-service", flags=True)  # the file was valid: a flag's
    if not config.experiments and not config.any:
        raise WorkerError(
            f'No experiment chosen: add experiments = ["SLUG"] (or "any") to {config_path(settings.config_dir)} '
            "or pass --experiment SLUG (or --any)",
            ExitCode.USAGE,
        )
    if resolve_credentials(settings).token is None:
        raise not_logged_in(settings.server)
    runner = Runner(
        config,
        state_dir(settings),
        command=join_command(config, listen=listen, insecure=insecure),
        conditions=default_conditions(config, power_supply_root),
        poll=poll,
        settle=settle,
        fetch=joinable_fetcher(settings, insecure),
    )
    what = "the experiment that needs peers most" if config.any else ", ".join(config.slugs)
    click.echo(f"Background worker for {what}; state in {runner.state_path}")
    raise click.exceptions.Exit(runner.run())
