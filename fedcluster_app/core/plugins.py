"""A user's own code named in the run config by import path, ``package.module:name``.

The model (``model``), the dataset (``dataset``) and the strategy (``strategy``) may each be
the user's: the run config carries only the path, and every process that needs the object
(the server, each Ray worker, each SuperNode) imports it itself. The module must therefore be
importable there: installed in the environment, or a module under the app's directory, which
``flwr run`` ships to the workers with the app (README, "Bring your own").
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sysconfig
from pathlib import Path

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_import_path(text: object) -> bool:
    """``package.module:name``, the form of a user's model, dataset or strategy."""
    return isinstance(text, str) and bool(IMPORT_PATH.match(text.strip()))


def import_object(path: str, key: str) -> object:
    """The object ``module:attribute`` names; ``key`` (the run-config key) is named in errors."""
    path = str(path).strip()
    if not is_import_path(path):
        raise ValueError(f"{key}: {path!r} is not an import path of the form 'package.module:name'")
    module_name, attr = path.split(":", 1)
    try:
        obj: object = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module failing as it loads
        raise ValueError(f"{key}: cannot import module {module_name!r} of {path!r}: "
                         f"{type(exc).__name__}: {exc} (it must be importable on the server and on "
                         f"every client: installed, or a module under the app's directory)"
                         ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{key}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def module_files(path: str) -> list[tuple[Path, str]]:
    """``(file, path relative to its import root)`` of the module an import path names, the
    other modules of its folder and its packages' ``__init__.py``, when it is a file of the
    user's project rather than an installed module (then ``[]``): what a Ray worker or a
    SuperNode needs to import it as well."""
    module = str(path).split(":", 1)[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return []
    origin = Path(spec.origin).resolve()
    installed = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    if any(root in origin.parents for root in installed):
        return []
    depth = len(module.split(".")) - (0 if origin.name == "__init__.py" else 1)
    root = origin.parents[depth]
    files = set(origin.parent.glob("*.py"))
    for package in origin.parents[:depth]:
        if (package / "__init__.py").is_file():
            files.add(package / "__init__.py")
    return sorted(((f, f.relative_to(root).as_posix()) for f in files), key=lambda t: t[1])
