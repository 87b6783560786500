"""The project's TOML files, in a checkout or in an installed wheel.

In a checkout (and in the app bundle `flwr run` installs) they sit next to the package; a wheel
carries copies inside the package as ``_<name with _>``.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent   # fedcluster_app/


def presets_dir() -> Path | None:
    """The directory of the bundled presets (``presets/`` of a checkout, a copy in a wheel)."""
    for path in (PACKAGE_DIR.parent / "presets", PACKAGE_DIR / "_presets"):
        if path.is_dir():
            return path
    return None


def project_file(name: str) -> Path:
    for path in (PACKAGE_DIR.parent / name, PACKAGE_DIR / f"_{name.replace('-', '_')}"):
        if path.is_file():
            return path
    raise FileNotFoundError(f"{name} not found next to {PACKAGE_DIR}")
