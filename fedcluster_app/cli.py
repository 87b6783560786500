"""The ``fedcluster`` command line: run, list, report, export, predict."""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import shlex
import sys
import time
from pathlib import Path

from fedcluster_app.bench import command as bench_command
from fedcluster_app.core.config import (
    ConfigError,
    default_run_config,
    merge_overrides,
    parse_assignment,
)
from fedcluster_app.core.config import list_presets, preset_file
from fedcluster_app.core.stopping import Interrupted, stop_signals

#: `fedcluster run`'s exit status by the run's summary status (2: refused before it started)
EXIT_CODES = {"completed": 0, "failed": 1, "degraded": 3}
#: stopped by Ctrl-C (128 + SIGINT, as shells report it); SIGTERM gives 143 (128 + 15)
EXIT_INTERRUPTED = 130
#: refused before anything ran or was written
EXIT_REFUSED = 2

RUN_EPILOG = """\
exit status:
  0  the run completed (also when --resume finds it already finished: nothing changes)
  1  the run failed (the reason is printed; summary.json says status "failed")
  2  refused before anything ran or was written: bad configuration (the key is named), a
     checkpoint that is not this run's or is corrupt, --out holding a finished run, files
     that are not a run's, or a run still writing it
  3  the run ended degraded (the reason is printed; summary.json says status "degraded")
  130  interrupted by SIGINT (Ctrl-C), 143 by SIGTERM: every process the run started is
       stopped, its checkpoint written, summary.json says status "interrupted", and one
       line says where the run is and the command that continues it
"""


def versions() -> str:
    """fedcluster's, Flower's and PyTorch's installed versions, read from the packages'
    metadata: nothing is imported (``fedcluster --version`` answers at once)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(dist: str) -> str:
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            return f"{dist} not installed"

    return ", ".join(of(dist) for dist in ("fedcluster", "flwr", "torch"))


class _VersionAction(argparse.Action):
    """``--version``: print :func:`versions` and exit (read only when asked)."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print fedcluster's, flwr's and torch's versions and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(versions())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedcluster", description=__doc__)
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one experiment and wait for it", epilog=RUN_EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--strategy", help="algorithm (see `fedcluster list`)")
    run.add_argument("--scenario", help="data and drift scenario (see `fedcluster list`)")
    run.add_argument("--out", help="results directory (run-config key out-dir)")
    run.add_argument("--seed", type=int)
    run.add_argument("--engine", choices=("inprocess", "ray", "deployment"), default="inprocess",
                     help="inprocess: this process, no Ray (fast); ray: `flwr run` simulation; "
                          "deployment: `flwr run` on a running SuperLink")
    run.add_argument("--federation",
                     help="profile from pyproject-flwr.toml: a simulation one for --engine ray "
                          "(default cpu), a deployment one for --engine deployment (default local)")
    run.add_argument("--ray-address", metavar="HOST:PORT",
                     help="with --engine ray: run on this running Ray cluster (its head's "
                          "address, or auto), overriding the profile's ray-address")
    run.add_argument("--deployment", type=Path, metavar="DIR",
                     help="with --engine deployment: submit to the local deployment in DIR "
                          "(started by `fedcluster deploy up --dir DIR`)")
    run.add_argument("--run-config", action="append", default=[],
                     metavar="FILE.toml | 'KEY=VALUE ...'",
                     help="run-config keys as `flwr run --run-config` takes them: a .toml file, "
                          "or key=value pairs in TOML syntax with strings quoted, e.g. "
                          "'seed=3 scenario=\"sea4\"' (repeatable; --set takes bare words)")
    run.add_argument("--preset", metavar="NAME",
                     help="a bundled preset (`fedcluster list presets`): a paper's experiment; "
                          "--run-config, --set and the flags below win over it")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="any run-config key, repeatable (e.g. --set rounds-per-step=10)")
    run.add_argument("--resume", type=Path, metavar="DIR",
                     help="continue the run whose checkpoint is in DIR, with that run's "
                          "strategy, scenario and config (a different one is refused)")
    run.add_argument("--overwrite", action="store_true", default=None,
                     help="replace the finished run in the results directory (refused "
                          "otherwise; run-config key overwrite)")

    lst = sub.add_parser("list", help="strategies, scenarios, federations, run-config keys, "
                         "the strategies' hyper-parameters (params), presets and the scenarios' "
                         "paper protocols")
    lst.add_argument("what", nargs="?", default="all",
                     choices=("all", "strategies", "scenarios", "federations", "config", "params",
                              "presets", "protocols"))
    lst.add_argument("--toml", action="store_true",
                     help="with params: print the tables as pyproject.toml holds them")
    lst.add_argument("--strategy", metavar="PACKAGE.MODULE:CLASS",
                     help="with params: your strategy's table (add it to pyproject.toml for "
                          "plain `flwr run .`)")

    dep = sub.add_parser("deploy", help="start/stop a SuperLink + SuperNodes on 127.0.0.1")
    dep.add_argument("action", choices=("up", "down", "status"))
    dep.add_argument("--dir", type=Path, default=Path(".fedcluster/deploy"),
                     help="state, logs, certificates and keys (default .fedcluster/deploy)")
    dep.add_argument("--nodes", type=int, default=3, help="SuperNodes (client-id 0..N-1)")
    dep.add_argument("--port", type=int, default=9093, help="the SuperLink's HTTP port")
    dep.add_argument("--tls", action="store_true", help="TLS with a self-signed CA in DIR/certs")
    dep.add_argument("--auth", action="store_true",
                     help="SuperNode authentication: keys in DIR/keys, registered with the SuperLink")
    dep.add_argument("--stock-supernodes", action="store_true",
                     help="plain flower-supernode: a fresh ClientApp process per message and "
                          "Flower's 3 s polls (default: one long-lived ClientApp process per "
                          "SuperNode and short polls, a round in seconds)")
    dep.add_argument("--data-dir", help="node-config data-dir of every SuperNode (its local data: a "
                     "torchvision directory or a dataset such as npz:PATH); {id} becomes the "
                     "node's client-id, e.g. npz:data/client{id}.npz")

    cert = sub.add_parser("certs", help="make a self-signed CA and a server certificate")
    cert.add_argument("dir", type=Path)
    cert.add_argument("--host", action="append", default=[],
                      help="server name or IP in the certificate (repeatable; default 127.0.0.1 "
                           "and localhost)")

    keys = sub.add_parser("keys", help="make SuperNode key pairs (and register them)")
    keys.add_argument("dir", type=Path, help="where the key files go")
    keys.add_argument("names", nargs="+", help="one key pair per name (e.g. one per device)")
    keys.add_argument("--register", metavar="FEDERATION",
                      help="register the public keys with this deployment profile's SuperLink")

    rep = sub.add_parser("report", help="compare finished runs: a table and a plot")
    rep.add_argument("dirs", nargs="+", type=Path)
    rep.add_argument("--plot", type=Path, help="where to write the comparison plot")
    rep.add_argument("--baseline", help="strategy whose run is the time-to-target reference "
                     "(default: fedavg or fedprox runs of the same scenario and seed)")
    rep.add_argument("--target", type=float, help="target accuracy (default: 0.9 x the highest "
                     "accuracy a compared run of the scenario, seed and scoring rule holds to "
                     "its end)")
    rep.add_argument("--format", choices=("md", "csv", "json"), default="md",
                     help="md: tables (default); csv: one row per run; json: every number")
    exp = sub.add_parser("export", help="write a run's cluster models (safetensors state_dicts, "
                         "TorchScript) and a manifest that load without fedcluster "
                         "(docs/guides/export.md)")
    exp.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                     help="a run directory with its checkpoint.npz (or the checkpoint file)")
    exp.add_argument("--out", type=Path, required=True, help="where the export goes")
    exp.add_argument("--overwrite", action="store_true",
                     help="replace an export already in --out (refused otherwise)")

    pre = sub.add_parser("predict", help="predict with a run's models: for a client of the run "
                         "(--client-id), or for a new client routed to its cluster by the "
                         "strategy's rule from the labelled samples of --data")
    pre.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    pre.add_argument("--data", required=True, metavar="SPEC",
                     help="inputs as the run-config key dataset names them (npz:PATH with x "
                          "and optionally y, csv:PATH, parquet:PATH, imagefolder:PATH, ...), "
                          "raw: the run's preprocessing is applied; a table's columns are "
                          "read with the run's label-column and feature-columns")
    pre.add_argument("--client-id", type=int,
                     help="a client of the run: predict with its model (default: route the "
                          "data, whose labels must be the run's class indices)")
    pre.add_argument("--out", type=Path, required=True,
                     help="predictions: .csv (row, prediction[, label]) or .jsonl (also the "
                          "class probabilities)")
    bench_command.add_parser(sub)
    return p


def _resumed_config(resume: Path) -> dict:
    """The run config the run being resumed was started with, so that ``--resume DIR`` alone
    continues that run: from its checkpoint (a killed run has no summary.json), else from its
    summary.json (a checkpoint of an older version); empty when there is neither (the resume
    itself then names the missing or corrupt checkpoint)."""
    from fedcluster_app.core.server.checkpoint import checkpoint_file, read_checkpoint
    from fedcluster_app.core.results import read_summary

    try:
        saved = read_checkpoint(resume)[0].get("config")
    except (FileNotFoundError, ValueError):
        saved = None
    if saved is None:
        saved = (read_summary(checkpoint_file(resume).parent) or {}).get("config") or {}
    return {k: v for k, v in saved.items() if k not in ("resume-from", "out-dir", "overwrite")}


def read_run_config(text: str) -> dict:
    """The run-config keys of one ``--run-config`` argument, read by Flower's own parser of
    ``flwr run --run-config`` (a path ending in ``.toml`` is a file, anything else
    ``key=value`` pairs in TOML syntax), so the same argument means the same for both; a
    file's tables are flattened as Flower does (``[feddrift] delta = 0.1`` is
    ``feddrift.delta``). Flower skips what is not ``key=value``: refused here instead."""
    import click
    from flwr.common.config import parse_config_args

    if text.strip().endswith(".toml"):
        try:
            return parse_config_args([text.strip()])
        except OSError as exc:
            raise ConfigError(f"{text}: cannot read it: {exc.strerror}") from None
        except ValueError as exc:   # tomli's TOMLDecodeError
            raise ConfigError(f"{text}: not valid TOML: {exc}") from None
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"--run-config {text!r}: {exc}") from None
    stray = [w for w in words if "=" not in w]
    if stray or not words:
        raise ConfigError(f"--run-config {text!r}: expected a .toml file or key=value pairs "
                          f"(e.g. 'seed=3 scenario=\"sea4\"'), got {' '.join(stray) or 'nothing'}")
    try:
        return parse_config_args([text])
    except click.ClickException as exc:
        raise ConfigError(f"--run-config {text!r}: {exc.message} (--set KEY=VALUE takes bare "
                          "words)") from None


def _overrides(args: argparse.Namespace) -> tuple[dict, list[str]]:
    """The run-config keys the command line sets, and those of them set one by one (``--set``,
    inline ``--run-config`` pairs), which ``api.check_tables_read`` checks."""
    values: dict = _resumed_config(args.resume) if args.resume else {}
    typed: list[str] = []
    if args.preset:
        values.update(read_run_config(str(preset_file(args.preset))))
    for text in args.run_config:
        values.update(pairs := read_run_config(text))
        if not text.strip().endswith(".toml"):
            typed += pairs
    for item in args.set:
        key, value = parse_assignment(item)
        values[key] = value
        typed.append(key)
    for key, value in (("strategy", args.strategy), ("scenario", args.scenario),
                       ("out-dir", args.out), ("seed", args.seed), ("overwrite", args.overwrite)):
        if value is not None:
            values[key] = str(value) if key == "out-dir" else value
    if args.resume:
        from fedcluster_app.core.server.checkpoint import checkpoint_file

        values["resume-from"] = str(args.resume.resolve())
        values.setdefault("out-dir", str(checkpoint_file(args.resume).parent))
    if "out-dir" in values:
        values["out-dir"] = str(Path(str(values["out-dir"])).expanduser().resolve())
    return values, typed


def cmd_run(args: argparse.Namespace) -> int:
    from fedcluster_app.api import check_tables_read, run_config_defaults
    from fedcluster_app.core.experiment import load_experiment
    from fedcluster_app.core.run_lock import check_unlocked, run_lock, wait_unlocked
    from fedcluster_app.core.server.runner import mark_interrupted, resolve_out_dir
    from fedcluster_app.server_app import prepare

    if args.ray_address and args.engine != "ray":
        raise ValueError("--ray-address needs --engine ray")
    overrides, typed = _overrides(args)
    run_config = merge_overrides(run_config_defaults(overrides), overrides)
    check_tables_read(str(run_config["strategy"]), typed)
    # bad config fails here, before anything starts (a deployment's data live on its devices)
    exp = load_experiment(run_config, server=args.engine == "deployment")
    if args.engine != "deployment":   # the clients run on this machine: is the device there?
        from fedcluster_app.core.models import resolve_device

        resolve_device(exp.cfg.device)
    run_config["out-dir"] = str(out := resolve_out_dir(run_config))
    if args.engine != "deployment":   # a deployment's out-dir is where its ServerApp runs
        check_unlocked(out)           # another run writing it: say so before anything else
    # every refusal (a checkpoint that is not this run's, --out holding a finished run) before
    # Ray or a SuperLink starts and before any file is written, whatever the engine
    strategy, finished = prepare(run_config)
    if finished is not None:
        print(f"{strategy.resumed_from.parent}: this run already finished (round "
              f"{strategy.round} of {strategy.num_rounds}, status {finished['status']}); nothing "
              f"to do, no file changed")
        return _report(finished, str(strategy.resumed_from.parent))
    t0 = time.monotonic()
    try:
        with stop_signals(), (run_lock(out) if args.engine != "deployment"
                              else contextlib.nullcontext()) as token:
            try:
                summary = _run_engine(args, run_config, exp, token)
            except Interrupted as ex:
                # its ServerApp was stopped with its process (Ray), or by `flwr stop` (a
                # local deployment's writes here too); the lock: it is gone
                if args.engine == "ray" or args.deployment:
                    try:
                        wait_unlocked(out, timeout=30)
                        with run_lock(out):
                            mark_interrupted(strategy, out, ex.signame, time.monotonic() - t0)
                    except Exception as why:   # noqa: BLE001 (still say where the run is)
                        print(f"fedcluster: could not mark {out}/summary.json interrupted: "
                              f"{why}", file=sys.stderr)
                raise
    except Interrupted as ex:
        print(interrupted(run_config, args.engine == "deployment"), file=sys.stderr)
        return ex.exit_code
    except KeyboardInterrupt:   # before the handlers were in place
        print(interrupted(run_config, args.engine == "deployment"), file=sys.stderr)
        return EXIT_INTERRUPTED
    return _report(summary, run_config["out-dir"])


def _run_engine(args: argparse.Namespace, run_config: dict, exp, lock_token: str | None) -> dict:
    """Run on the engine the command line chose; the run's summary."""
    if args.engine == "inprocess":
        from fedcluster_app.engine import run_inprocess

        return run_inprocess(run_config)
    from fedcluster_app.core.run_lock import TOKEN_ENV
    from fedcluster_app.launcher import run_on_deployment, run_with_flwr

    if args.engine == "ray":
        # the ServerApp writes out-dir in Flower's simulation process, for this lock's holder
        os.environ[TOKEN_ENV] = str(lock_token)
        try:
            return run_with_flwr(run_config, exp.scenario.num_clients,
                                 federation=args.federation or "cpu",
                                 ray_address=args.ray_address)
        finally:
            os.environ.pop(TOKEN_ENV, None)
    if args.deployment:
        from fedcluster_app.deploy import LocalDeployment

        return run_on_deployment(run_config, LocalDeployment.load(args.deployment).connection())
    return run_on_deployment(run_config, federation=args.federation or "local")


def interrupted(run_config: dict, deployment: bool = False) -> str:
    """The one line an interrupted run ends with: where the run is, and how to continue it."""
    from fedcluster_app.core.server.checkpoint import read_checkpoint, resume_command

    out_dir = Path(run_config["out-dir"])
    if deployment:
        return (f"fedcluster: interrupted: the run submitted to the SuperLink was stopped "
                f"(`flwr stop`); its files are in {out_dir} where its ServerApp runs")
    command = resume_command(out_dir)
    if command is None:
        return (f"fedcluster: interrupted: {out_dir} holds no checkpoint to resume from (none was "
                f"written before the run was stopped); run the same command with --overwrite to "
                f"start again")
    try:
        done = int(read_checkpoint(out_dir)[0]["round"])
    except (FileNotFoundError, ValueError, KeyError):
        done = "?"
    return (f"fedcluster: interrupted: {out_dir} has the run's checkpoint after round {done}; "
            f"continue it with: {command}")


def _report(summary: dict, out_dir: str) -> int:
    """Print the run's one-line result; its exit status (EXIT_CODES) from the summary status,
    with the reason when it is not "completed"."""
    def num(key: str) -> str:
        value = summary.get(key)
        return "n/a" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)

    status = summary.get("status", "completed")
    if "strategy" in summary:   # else its summary.json is on the machine the ServerApp ran on
        print(f"{summary['strategy']} on {summary.get('scenario')} (seed {summary.get('seed')}): "
              f"mean accuracy {num('mean_accuracy')}, final {num('final_accuracy')}, ARI "
              f"{summary.get('ari_final')}, {summary.get('wall_time_s') or 0:.1f} s -> {out_dir}")
    else:
        print(f"run {status}; its results are in {out_dir} where the ServerApp ran")
    if status != "completed":
        reason = summary.get("reason") or summary.get("error") or "no reason recorded"
        print(f"fedcluster: run {status}: {reason} (see {out_dir}/summary.json)", file=sys.stderr)
    return EXIT_CODES.get(status, 1)


def _param_rows(params) -> list[tuple[str, str]]:
    """``(<table>.<key>, "default (allowed): doc")`` of every hyper-parameter of ``params``."""
    return [(f"{params.table}.{key}", f"{default!r} ({allowed}): {doc}")
            for key, default, allowed, doc in params.describe()]


def cmd_list(args: argparse.Namespace) -> int:
    # the registry's declarations only, never a strategy's module: no torch, answers at once
    from fedcluster_app.core.data.catalogue import list_scenarios, scenario_protocol
    from fedcluster_app.core.hparams import toml_table
    from fedcluster_app.core.plugins import is_import_path
    from fedcluster_app.families import (hyperparameter_tables, hyperparameter_users,
                                         list_strategies, strategy_info)
    from fedcluster_app.launcher import load_profiles

    if args.strategy:
        if is_import_path(args.strategy):   # the user's class, imported (torch and all)
            from fedcluster_app.api import load_strategy

            params = load_strategy(args.strategy).Params
        else:
            params = strategy_info(args.strategy).params
        if not params.table:
            print(f"{args.strategy} has no hyper-parameters")
        elif args.toml:
            print(toml_table(params, args.strategy))
        else:
            for key, text in _param_rows(params):
                print(f"  {key}  {text}")
        return 0
    if args.toml:
        print(hyperparameter_tables(), end="")
        return 0

    sections = []
    if args.what in ("all", "strategies"):
        sections.append(("strategies (run-config key `strategy`)", list_strategies()))
    if args.what in ("all", "scenarios"):
        sections.append(("scenarios (run-config key `scenario`)", list_scenarios()))
    if args.what in ("all", "federations"):
        rows = [(f"{name} ({kind})", str(cfg.get("description", "")))
                for kind, profiles in load_profiles().items() for name, cfg in profiles.items()]
        sections.append(("federations (fedcluster run --federation)", rows))
    if args.what in ("all", "config"):
        sections.append(("run-config keys and defaults",
                         [(k, repr(v)) for k, v in default_run_config().items() if "." not in k]))
    if args.what in ("all", "presets"):
        sections.append(("presets (fedcluster run --preset NAME)", list_presets()))
    if args.what in ("all", "protocols"):
        rows = [(name, ", ".join(f"{k}={v}" for k, v in scenario_protocol(name).items()))
                for name, _ in list_scenarios() if scenario_protocol(name)]
        sections.append(("scenarios' paper protocols (applied to keys left at their defaults; "
                         "protocol = \"none\" turns them off)", rows))
    if args.what in ("all", "params"):
        for params, names in sorted(hyperparameter_users().items(), key=lambda u: u[0].table):
            sections.append((f"hyper-parameters of {', '.join(sorted(names))} "
                             f"(--set {params.table}.<key>=...)", _param_rows(params)))
    for title, rows in sections:
        print(f"{title}:")
        width = max(len(name) for name, _ in rows)
        for name, text in rows:
            print(f"  {name:<{width}}  {text}")
        print()
    return 0


def _absolute_data_dir(value: str) -> str:
    """The SuperNodes run in their own directory: make a relative path (of a directory or of
    a dataset such as ``npz:data/x.npz``) absolute."""
    from fedcluster_app.core.data.sources import is_node_spec, parse_dataset_spec

    if is_node_spec(value):
        kind, path = parse_dataset_spec(value)   # the path comes back absolute
        return f"{kind}:{path}"
    return str(Path(value).expanduser().resolve())


def cmd_deploy(args: argparse.Namespace) -> int:
    from fedcluster_app.deploy import DeploymentRunning, LocalDeployment

    if args.action == "up":
        configs = [{"client-id": i, **({"data-dir": _absolute_data_dir(
                        args.data_dir.replace("{id}", str(i)))} if args.data_dir else {})}
                   for i in range(args.nodes)]
        try:
            dep = LocalDeployment(args.dir, tls=args.tls, auth=args.auth, port=args.port,
                                  node_configs=configs,
                                  stock_supernodes=args.stock_supernodes).up()
        except DeploymentRunning as ex:   # a second `up` would orphan the first deployment
            print(f"fedcluster: error: {ex}", file=sys.stderr)
            return 2
        print(f"SuperLink on {dep.address} ({'TLS' if dep.tls else 'insecure'}"
              f"{', SuperNode auth' if dep.auth else ''}), {dep.num_nodes} SuperNodes online; "
              f"logs in {dep.dir}.\nRun with: fedcluster run --engine deployment --deployment "
              f"{args.dir} --set num-clients={dep.num_nodes}\nStop with: fedcluster deploy down "
              f"--dir {args.dir}")
    elif args.action == "down":
        LocalDeployment.load(args.dir).down()
        print(f"stopped the deployment in {args.dir}")
    else:
        dep = LocalDeployment.load(args.dir)
        print(f"SuperLink {dep.address}: {dep.online_nodes()} SuperNodes online; processes "
              f"{dep.pids}, of which running {dep.running()}")
    return 0


def cmd_certs(args: argparse.Namespace) -> int:
    from fedcluster_app.deploy import make_certificates

    files = make_certificates(args.dir, tuple(args.host) or ("127.0.0.1", "localhost"))
    print("\n".join(f"{name}: {path}" for name, path in files.items()))
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from fedcluster_app.deploy import make_node_keys, register_key
    from fedcluster_app.launcher import deployment_connection

    connection = deployment_connection(args.register) if args.register else None
    for name in args.names:
        private, public = make_node_keys(args.dir, name)
        print(f"{name}: private key {private} (copy it to the device only), public key {public}")
        if connection is not None:
            register_key(public, connection)
            print(f"{name}: registered with the SuperLink of {args.register!r}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedcluster_app.core.results import compare_runs

    print(compare_runs(args.dirs, out_path=args.plot, baseline=args.baseline, target=args.target,
                       fmt=args.format), end="")
    if args.plot:   # csv and json stay machine-readable on stdout
        print(f"\nplot: {args.plot}", file=sys.stdout if args.format == "md" else sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    import json

    from fedcluster_app.export import export_run

    path = export_run(args.run_dir, args.out, overwrite=args.overwrite)
    manifest = json.loads(path.read_text())
    skipped = {m: e["torchscript_skipped"] for m, e in manifest["models"].items()
               if e.get("torchscript_skipped")}
    print(f"{manifest['strategy']}: {len(manifest['models'])} cluster models "
          f"({', '.join(manifest['models'])}), {len(manifest['personal'])} clients' personal "
          f"parts -> {path.parent} (manifest {path.name})")
    for mid, why in skipped.items():
        print(f"model {mid}: no TorchScript: {why}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    import json

    import torch

    from fedcluster_app.core.data.sources import read_raw
    from fedcluster_app.core.data.tables import ReadOptions, column_names
    from fedcluster_app.serving import load_run

    if args.out.suffix not in (".csv", ".jsonl"):
        raise ValueError(f"--out {args.out}: expected a .csv or .jsonl file name")
    run = load_run(args.run_dir)
    cfg = run.run.exp.cfg
    # the run's columns: its label, its features, and its partition column left out
    read = ReadOptions(cfg.label_column, column_names(cfg.feature_columns), cfg.partition_column)
    x, y = read_raw(args.data, read, cfg.effective_data_seed)
    if args.client_id is not None:
        probs = run.predict_proba(x, client_id=args.client_id)
        print(f"client {args.client_id}: cluster {run.assignments.get(args.client_id)}")
    else:
        if y is None:
            raise ValueError(f"--data {args.data}: has no labels, and routing a new client "
                             f"needs labelled samples; give --client-id to predict for a "
                             f"client of the run")
        route = run.route(x, y)
        with torch.no_grad():
            probs = torch.softmax(route.model(torch.from_numpy(run.prepare(x))), 1).numpy()
        print(f"routed to cluster {route.model_id} ({route.rule}): "
              f"{json.dumps(route.evidence)}")
    pred = probs.argmax(1)
    names = run.class_names     # a prediction as the data's own label too (remap-labels)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as fh:
        if args.out.suffix == ".csv":
            fh.write("row,prediction" + (",class" if names else "")
                     + (",label" if y is not None else "") + "\n")
            for i, p in enumerate(pred):
                fh.write(f"{i},{p}" + (f",{names[p]}" if names else "")
                         + (f",{y[i]}" if y is not None else "") + "\n")
        else:
            for i, p in enumerate(pred):
                row = {"row": i, "prediction": int(p), "probabilities": probs[i].round(6).tolist()}
                if names:
                    row["class"] = names[p]
                if y is not None:
                    row["label"] = y[i].item() if hasattr(y[i], "item") else y[i]
                fh.write(json.dumps(row) + "\n")
    if y is not None:
        try:
            print(f"accuracy on the given labels: {float((pred == run.labels(y)).mean()):.4f}")
        except ValueError as ex:      # labels that are not the run's: predictions only
            print(f"no accuracy: {ex}")
    print(f"{len(pred)} predictions -> {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.INFO)
    # a user's model, dataset or strategy module in the current directory imports, as with
    # `python -m` (the console script's own directory is the venv's bin/)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        commands = {"run": cmd_run, "list": cmd_list, "report": cmd_report,
                    "deploy": cmd_deploy, "certs": cmd_certs, "keys": cmd_keys,
                    "export": cmd_export, "predict": cmd_predict,
                    "bench": lambda a: bench_command.run(a, argv if argv is not None
                                                         else sys.argv[1:])}
        return commands[args.command](args)
    except KeyboardInterrupt:   # cmd_run says where a run it started is
        before = " before the run started: nothing written" if args.command == "run" else ""
        print(f"fedcluster: interrupted{before}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ConfigError, ValueError, FileNotFoundError, FileExistsError) as ex:
        print(f"fedcluster: error: {ex}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as ex:   # e.g. a path over the file-name limit: name the path
        if ex.errno not in (errno.ENAMETOOLONG, errno.EACCES, errno.EROFS, errno.ENOTDIR):
            print(f"fedcluster: run failed: {type(ex).__name__}: {ex}", file=sys.stderr)
            return 1
        print(f"fedcluster: error: {ex.filename or ''}: {ex.strerror}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as ex:  # a failed run: say so and exit non-zero
        print(f"fedcluster: run failed: {type(ex).__name__}: {ex}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
