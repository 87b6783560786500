"""The long-lived ClientApp process's app cache: loaded once per FAB, reloaded from a new FAB.

(Its tasks end to end, errors and Context.state included, are in tests/test_deployment.py.)
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from types import SimpleNamespace

from flwr.cli.build import build_fab_from_disk

from fedcluster_app import clientapp_worker as worker

PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "workerprobe"
version = "1.0.0"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "probe"

[tool.flwr.app.components]
serverapp = "workerprobe.app:app"
clientapp = "workerprobe.app:app"
"""


RUN = SimpleNamespace(fab_id="probe/workerprobe", fab_version="1.0.0")


def fab_of(app_dir: Path, version: int, body: str = "") -> SimpleNamespace:
    """The FAB of a one-module app whose module says ``VERSION = version`` (and runs ``body``)."""
    (app_dir / "workerprobe").mkdir(parents=True, exist_ok=True)
    (app_dir / "pyproject.toml").write_text(PYPROJECT)
    (app_dir / "workerprobe" / "__init__.py").write_text("")
    (app_dir / "workerprobe" / "app.py").write_text(
        f"from flwr.clientapp import ClientApp\nVERSION = {version}\napp = ClientApp()\n{body}")
    content = build_fab_from_disk(app_dir)
    return SimpleNamespace(content=content, hash_str=hashlib.sha256(content).hexdigest())


def test_the_app_is_loaded_once_per_fab_and_again_from_a_new_one(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    run = RUN
    loaded = worker.LoadedApp()
    try:
        first = fab_of(tmp_path / "src", 1)
        app = loaded.get(run, first)
        assert sys.modules["workerprobe.app"].VERSION == 1
        assert loaded.get(run, first) is app                  # the same FAB: not loaded again
        old_dir = str(loaded.dir.absolute())
        assert old_dir in sys.path

        second = fab_of(tmp_path / "src", 2)                  # the app changed: a new FAB
        assert second.hash_str != first.hash_str
        again = loaded.get(run, second)
        assert again is not app and sys.modules["workerprobe.app"].VERSION == 2
        assert sys.modules["workerprobe.app"].__file__.startswith(str(loaded.dir))
        assert old_dir not in sys.path                        # the old version's code is gone
    finally:
        loaded.forget()
    assert "workerprobe" not in sys.modules and "workerprobe.app" not in sys.modules


def test_a_fab_that_fails_to_load_leaves_nothing_half_imported(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    broken = fab_of(tmp_path / "src", 1, body="raise RuntimeError('broken app')\n")
    loaded = worker.LoadedApp()
    try:
        loaded.get(RUN, broken)
    except Exception as ex:   # noqa: BLE001 (whatever Flower wraps it in: an error reply)
        assert "broken app" in repr(ex) or isinstance(ex, worker.LoadClientAppError), repr(ex)
    else:
        raise AssertionError("a failing app loaded")
    assert "workerprobe" not in sys.modules and loaded.app is None
    assert not any("workerprobe" in entry for entry in sys.path)
    fixed = fab_of(tmp_path / "src", 2)                    # the next task's FAB loads cleanly
    assert loaded.get(RUN, fixed) is not None and sys.modules["workerprobe.app"].VERSION == 2
    loaded.forget()


def test_a_message_that_never_arrives_fails_its_task_in_bounded_time(monkeypatch):
    """The SuperNode offers a task whose message it cannot fetch any more (its run ended while
    the SuperLink was down): the pull gives up after PULL_MAX_S, so the worker is free for the
    next run's tasks instead of retrying forever."""
    import time

    from flwr.app import Context, RecordDict
    from flwr.common.serde import context_to_proto
    from flwr.proto.message_pb2 import Message as MessageProto  # pylint: disable=E0611
    from flwr.proto.message_pb2 import ObjectTree, PullObjectResponse  # pylint: disable=E0611
    from flwr.proto.runtime_pb2 import (PullAppMessagesResponse,  # pylint: disable=E0611
                                        PullTaskInputResponse)
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError

    context = Context(run_id=7, node_id=3, node_config={}, state=RecordDict(), run_config={})
    pulls: list[str] = []

    class StaleSuperNode:   # the Runtime API of a SuperNode that lost the message's contents
        def PullTaskInput(self, request):  # noqa: N802 (Flower's RPC names)
            return PullTaskInputResponse(context=context_to_proto(context), task_id=1)

        def PullMessages(self, request):  # noqa: N802
            return PullAppMessagesResponse(messages_list=[MessageProto()],
                                           message_object_trees=[ObjectTree(object_id="ab" * 32)])

        def PullObject(self, request):  # noqa: N802
            pulls.append(request.object_id)
            return PullObjectResponse(object_found=True, object_available=False)

        def ConfirmMessageReceived(self, request):  # noqa: N802
            raise AssertionError("nothing was received")

    monkeypatch.setattr(worker, "PULL_MAX_S", 0.5)
    start = time.monotonic()
    try:
        worker.pull_task_input(StaleSuperNode())
    except ObjectPullError:
        pass
    else:
        raise AssertionError("a message that never arrived was returned")
    assert time.monotonic() - start < 5 and len(pulls) > 1     # retried, then gave up

