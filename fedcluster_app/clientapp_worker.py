"""A long-lived ClientApp process for one SuperNode: the app is loaded (torch imported) once.

By default a SuperNode starts a SuperExec that launches a fresh `flwr-clientapp` process for
every message, which imports torch, Flower and the app again each time (seconds per message).
Started with ``--isolation process`` a SuperNode launches nothing and waits for an executor to
claim its tasks on its Runtime API; this is that executor, kept running:

    python -m fedcluster_app.clientapp_worker --runtime-api-address 127.0.0.1:9094 --insecure

It claims one ClientApp task at a time and runs it as `flwr-clientapp` would, with Flower's own
functions for the protocol (``run_clientapp``'s ``push_message`` and ``push_task_output``, its
``pull_task_input`` with a shorter retry, the task heartbeat, ``install_from_fab`` and the
multi-app loader), only in this process: each task's message and ``Context`` (its ``state`` included) come from the
SuperNode and go back to it; an exception becomes an error reply and the next task runs; the
app is loaded again when a task's FAB differs from the one loaded (a new version of the app),
with the previous one's modules dropped first. Runtime dependency installation (which needs a
fresh interpreter per run) is not supported here: a SuperNode that needs it keeps the default
isolation.

Given a command after ``--`` (a `flower-supernode ... --isolation process`), the worker starts
it as its child, in its own process group, and lives exactly as long as it does: stopping the
group stops both, and the worker exits with the SuperNode's exit status.

Only Flower and the standard library are imported here: the app, with its own copy of this
package, comes from the FAB of each run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import subprocess
import sys
import time
from logging import DEBUG, ERROR, INFO, WARNING
from pathlib import Path

from flwr.app import Message
from flwr.app.error import Error
from flwr.cli.install import install_from_fab
from flwr.clientapp.client_app import ClientApp, LoadClientAppError
from flwr.clientapp.utils import get_load_client_app_fn
from flwr.common.config import get_project_dir
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import (AcquireTaskRequest,  # pylint: disable=E0611
                                    PullAppMessagesRequest, PullTaskInputRequest)
from flwr.supercore import log
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf, make_pull_object_fn_protobuf)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.interceptors import (RuntimeTokenHttpInterceptor,
                                         RuntimeVersionHttpInterceptor)
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.tls import validate_and_resolve_root_certificates
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

# Seconds between two claims while the SuperNode has no task: 10 ms after a task (the next
# message comes soon in a run), growing by half each time to at most 0.25 s (idle, a claim is a
# small request to the SuperNode four times a second)
CLAIM_FIRST_S, CLAIM_GROWTH, CLAIM_MAX_S = 0.01, 1.5, 0.25


# A SuperNode offers a task before it has fetched the message's contents from the SuperLink
# (moments later, seconds under load): Flower's pull then waits 1 s, then 2 s, ... for what is
# missing, which a fresh process, starting seconds later, rarely meets. This worker starts at
# once: it asks again sooner.
PULL_BACKOFF_S = 0.01
PULL_BACKOFF_CAP_S = 0.5
# ...but not forever: a message the SuperNode still lacks after this long will not come (its run
# ended, e.g. the SuperLink was restarted after a crash and answers "run is finished"). The
# task fails and the worker takes the next one; waiting on, it would block every later run.
# (A fresh `flwr-clientapp` per message waits up to two hours, but it blocks nobody.)
PULL_MAX_S = 60.0


class TaskCancelled(Exception):
    """SIGINT while a task runs: its heartbeat was refused (the SuperNode dropped the task)."""


class LoadedApp:
    """The ClientApp of one FAB, loaded into this process; another FAB replaces it."""

    def __init__(self) -> None:
        self.fab_hash: str | None = None
        self.dir: Path | None = None
        self.app: ClientApp | None = None

    def get(self, run, fab) -> ClientApp:
        if fab.hash_str == self.fab_hash and self.app is not None:
            return self.app
        self.forget()
        install_from_fab(fab.content, skip_prompt=True)
        self.dir = get_project_dir(run.fab_id, run.fab_version, fab.hash_str)
        drop_modules(top_level_names(self.dir))  # e.g. this package, imported to run the worker
        load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
        try:
            self.app = load(run.fab_id, run.fab_version, fab.hash_str)
        except BaseException:
            self.forget()                        # a half-imported app: the next task starts over
            raise
        self.fab_hash = fab.hash_str
        log(INFO, "[clientapp-worker] loaded the ClientApp of %s %s (FAB %s)", run.fab_id,
            run.fab_version, fab.hash_str[:8])
        return self.app

    def forget(self) -> None:
        """Drop the loaded app: its modules and its directory on sys.path."""
        if self.dir is not None:
            drop_modules(top_level_names(self.dir))
            with contextlib.suppress(ValueError):
                sys.path.remove(str(self.dir.absolute()))
        self.fab_hash = self.dir = self.app = None


def top_level_names(app_dir: Path) -> set[str]:
    """The importable top-level modules and packages an installed FAB holds."""
    return {p.stem if p.suffix == ".py" else p.name for p in Path(app_dir).iterdir()
            if p.suffix == ".py" or (p / "__init__.py").is_file()}


def drop_modules(names: set[str]) -> None:
    """Forget modules ``names`` and their submodules, so the next import reads them anew."""
    for mod in [m for m in sys.modules if m.split(".", 1)[0] in names]:
        del sys.modules[mod]
    importlib.invalidate_caches()


def pull_task_input(client: RuntimeHttpClient):
    """``flwr.supernode.runtime.run_clientapp.pull_task_input`` with PULL_BACKOFF_S: the task's
    message, its Context (state included), its Run and FAB from the SuperNode."""
    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context = context_from_proto(res.context)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree, make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node,
                                                  context.run_id),
        return_type=Message, max_tries_per_object=None, max_time=PULL_MAX_S,
        initial_backoff=PULL_BACKOFF_S,
        backoff_cap=PULL_BACKOFF_CAP_S)
    message.metadata.__dict__["_message_id"] = tree.object_id   # as Flower's: not in the tree
    return message, context, run_from_proto(res.run), fab_from_proto(res.fab)


def run_task(address: str, token: str, insecure: bool, certificates: bytes | None,
             loaded: LoadedApp) -> None:
    """One task, as ``flwr.supernode.runtime.run_clientapp`` runs it, in this process."""
    client = RuntimeHttpClient.from_server_address(
        server_address=address, insecure=insecure, root_certificates=certificates,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                      RuntimeTokenHttpInterceptor(token)],
        retry_invoker=make_simple_http_retry_invoker())
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    message = reply = context = None
    sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
    try:
        heartbeat.start()
        message, context, run, fab = pull_task_input(client)
        reply = loaded.get(run, fab)(message=message, context=context)
        sub_status, details = SubStatus.COMPLETED, ""
    except TaskCancelled:
        details = "the SuperNode cancelled the task"
        log(WARNING, "[clientapp-worker] %s", details)
        reply = None                                  # nobody awaits it any more
    except Exception as ex:  # pylint: disable=broad-exception-caught
        code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
        details = str(type(ex)) + ":<'" + str(ex) + "'>"   # flwr-clientapp's wording
        if isinstance(ex, LoadClientAppError):
            code = ErrorCode.LOAD_CLIENT_APP_EXCEPTION
            details = "An exception was raised when attempting to load `ClientApp`"
        log(ERROR, "ClientApp raised an exception", exc_info=ex)
        if message is not None:
            reply = Message(Error(code=code, reason=details), reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                try:
                    push_message(client, reply, context)
                except Exception as ex:  # pylint: disable=broad-exception-caught
                    log(ERROR, "Failed to push reply message", exc_info=ex)
            push_task_output(client, context, sub_status, details)
        finally:
            if heartbeat.is_running:
                heartbeat.stop()
            client.close()


def serve(address: str, insecure: bool, certificates: bytes | None, alive) -> None:
    """Claim and run ClientApp tasks while ``alive()``."""
    claims = RuntimeHttpClient.from_server_address(
        server_address=address, insecure=insecure, root_certificates=certificates,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        retry_invoker=make_simple_http_retry_invoker())
    loaded, running = LoadedApp(), [False]
    pause = CLAIM_MAX_S

    def on_sigint(signum, frame):
        # Flower's task heartbeat raises SIGINT when the SuperNode refuses it: that task is
        # over, the worker is not. Outside a task it is a stop request.
        if running[0]:
            raise TaskCancelled()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    log(INFO, "[clientapp-worker] serving ClientApp tasks of the SuperNode at %s", address)
    try:
        while alive():
            try:
                res = claims.AcquireTask(AcquireTaskRequest(
                    supported_task_types=[TaskType.CLIENT_APP.value]))
            except Exception as ex:  # pylint: disable=broad-exception-caught
                log(DEBUG, "[clientapp-worker] SuperNode not reachable: %s", ex)
                time.sleep(0.5)       # starting, or going: alive() decides
                continue
            if res.HasField("task") and res.token:
                running[0] = True
                try:
                    run_task(address, res.token, insecure, certificates, loaded)
                except TaskCancelled:
                    pass              # the cancel arrived while the task output was pushed
                finally:
                    running[0] = False
                pause = CLAIM_FIRST_S
            else:
                time.sleep(pause)
                pause = min(pause * CLAIM_GROWTH, CLAIM_MAX_S)
    finally:
        claims.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):   # a zombie is gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    node_cmd: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, node_cmd = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(prog="python -m fedcluster_app.clientapp_worker",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime-api-address", required=True,
                    help="the SuperNode's Runtime API (its --host:--port)")
    ap.add_argument("--insecure", action="store_true",
                    help="plain HTTP to the Runtime API (a SuperNode without --ssl-certfile)")
    ap.add_argument("--root-certificates", metavar="CA",
                    help="CA that signed the Runtime API's certificate (its --ssl-certfile)")
    ap.add_argument("--parent-pid", type=int,
                    help="exit when this process (e.g. the SuperNode) has exited")
    args = ap.parse_args(argv)
    if args.insecure == bool(args.root_certificates):
        ap.error("give exactly one of --insecure and --root-certificates")
    if node_cmd and args.parent_pid:
        ap.error("--parent-pid with a SuperNode command after --: the worker watches the "
                 "SuperNode it starts")
    certificates = validate_and_resolve_root_certificates(args.root_certificates, args.insecure)
    node = subprocess.Popen(node_cmd) if node_cmd else None   # noqa: S603 (our own command)

    def alive() -> bool:
        if node is not None:
            return node.poll() is None
        return args.parent_pid is None or pid_alive(args.parent_pid)

    def on_sigterm(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        serve(args.runtime_api_address, args.insecure, certificates, alive)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        if node is not None:
            stop_child(node)
    return node.wait() if node is not None else 0


def stop_child(node: subprocess.Popen) -> None:
    """The SuperNode this worker started, stopped: a SIGTERM to their process group reached it
    too and it is signing off (a second SIGTERM would cut that short: Flower's handler runs
    once), so it is given longer than ``deploy.stop_group`` waits before SIGKILL; a stop of the
    worker alone is passed on to it after that."""
    for wait, stop in ((12.0, node.terminate), (15.0, node.kill)):
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(timeout=wait)
        if node.poll() is not None:
            return
        stop()


if __name__ == "__main__":
    sys.exit(main())
