"""Where the worker runs: the platforms hivemind (the worker's swarm library) ships builds for, and the check that
``swarmhub doctor`` makes before its others. On Windows itself pip cannot install the worker at all (hivemind has no
Windows build), so the check speaks to worker installs that got through on another platform hivemind does not build
for (Linux on 32-bit ARM, BSD); ``PLATFORMS`` tells everyone else before they install (``GET /api/worker``)."""

from __future__ import annotations

import platform

# (platform.system(), platform.machine()) pairs with a hivemind 1.1.12 wheel (its p2pd binary): Linux x86_64 and
# aarch64, macOS arm64 and x86_64.
SUPPORTED = {("Linux", "x86_64"), ("Linux", "aarch64"), ("Darwin", "arm64"), ("Darwin", "x86_64")}
PLATFORMS = (
    "Linux (x86_64, aarch64) and macOS (arm64, x86_64) with Python 3.10 or newer; on Windows, inside WSL2 "
    "(hivemind, which the worker trains with, has no Windows build)"
)
WSL_FIX = "install WSL2 (`wsl --install` in PowerShell), then install and run swarmhub inside its Linux"


def describe(system: str | None = None, machine: str | None = None, release: str | None = None) -> str:
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    release = platform.release() if release is None else release
    wsl = " (WSL2)" if system == "Linux" and "microsoft" in release.lower() else ""
    return f"{system or 'unknown system'} {machine or 'unknown machine'}{wsl}"


def platform_problem(system: str | None = None, machine: str | None = None) -> tuple[str, str] | None:
    """None where the worker runs; else (what is wrong, what to do). Arguments default to this machine's."""
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine) if system == "Linux" else machine
    if (system, machine) in SUPPORTED:
        return None
    if system == "Windows":
        return "the worker does not run on Windows itself: hivemind has no Windows build", WSL_FIX
    return (
        f"hivemind, which the worker trains with, ships no build for {system} {machine}",
        "join from Linux (x86_64, aarch64) or macOS (arm64, x86_64); on Windows, inside WSL2",
    )
