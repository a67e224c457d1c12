"""The ``dsv4lab`` command line.

Errors that dsv4lab raises on purpose are printed as one ``Error: ...`` line with the exit status of their
class (2 for bad input, 3 for a host that cannot be reached, 4 for a host key, ... see
:mod:`dsv4lab.errors`), so scripts can branch on them and people are not shown a traceback for a typo;
anything else is a bug and keeps its traceback. Ctrl-C or SIGTERM exits 130 after stopping what the
command started.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from dsv4lab.cli.argparsing import ArgumentParser, add_host_options
from dsv4lab.config.launch_script import render_argv, render_env_file, render_launch_script, server_command
from dsv4lab.config.presets import PRESETS, preset
from dsv4lab.config.server_config import ServerConfig, diff, field_help, field_names, load
from dsv4lab.counts import plural
from dsv4lab.engines import ENGINE_NAMES, Engine, get_engine
from dsv4lab.errors import ConfigError, DSV4LabError, UnknownNameError, exit_code_for
from dsv4lab.resources import __version__

__all__ = ["main"]


def _parse_sets(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError("--set", item, "FIELD=VALUE, e.g. mem_fraction_static=0.6 or speculative.num_steps=2")
        out[key.strip()] = value
    return out


def _config_from_args(args: argparse.Namespace, engine: Engine | None = None) -> Any:
    """The config of ``--preset`` / ``--file`` and ``--set``, of the engine's own type (SGLang's by default)."""
    engine = engine or get_engine("sglang")
    return engine.build_config(file=args.file, preset=args.preset, overrides=_parse_sets(args.set) if args.set else {})


def _config_ref(ref: str) -> ServerConfig:
    """A preset name or a path to a .toml/.json config."""
    if ref in PRESETS:
        return preset(ref)
    if Path(ref).suffix in (".toml", ".json"):
        return load(ref)
    raise UnknownNameError("preset", ref, PRESETS, field="config", also="a .toml/.json file")


def _add_config_source(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--preset", metavar="NAME", help=f"start from a story preset: {', '.join(PRESETS)} (default config_a)"
    )
    src.add_argument("--file", help="start from a .toml or .json config file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field (repeatable); dotted for nested: speculative.num_steps=2, env.NCCL_PROTO=LL",
    )


def _cmd_config_show(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    if args.format == "json":
        print(config.to_json())
    elif args.format == "toml":
        print(config.to_toml(), end="")
    else:
        width = max(len(n) for n in field_names())
        for key, value in config.to_dict().items():
            print(f"{key:<{width}}  {value}")
    return 0


def _cmd_config_render(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    version = args.sglang_version
    if args.what == "argv":
        words = server_command(version, python=args.python, target=args.target) + render_argv(config, version)
        import shlex

        print(" ".join(shlex.quote(w) for w in words))
    elif args.what == "env":
        print(render_env_file(config), end="")
    else:
        print(
            render_launch_script(
                config, run_dir=args.run_dir, sglang_version=version, python=args.python, target=args.target
            ),
            end="",
        )
    return 0


def _cmd_config_diff(args: argparse.Namespace) -> int:
    d = diff(_config_ref(args.a), _config_ref(args.b))
    print(d)
    return 0


def _cmd_config_fields(args: argparse.Namespace) -> int:
    for name in field_names():
        print(f"{name:<32} {field_help(name)}")
    return 0


def _cmd_preflight(args: argparse.Namespace) -> int:
    import json

    from dsv4lab.model.memory import check_plan, preflight, suggest

    engine = get_engine(args.engine or "sglang")
    if engine.name == "vllm":
        return _vllm_preflight(args, engine)
    if args.host:
        raise ConfigError("--host", args.host, "only with --engine vllm (SGLang's preflight models --hardware)")
    config = _config_from_args(args, engine)
    hardware = args.hardware or "rtx-pro-6000-x8"
    try:
        check_plan(args.concurrency, args.context_len, args.margin_gib)
    except ConfigError as exc:
        raise ConfigError("--" + exc.field.replace("_", "-"), exc.value, exc.allowed) from None
    p = preflight(config, hardware, args.model, sglang_version=args.sglang_version)
    options = (
        suggest(
            config,
            hardware,
            args.model,
            concurrency=args.concurrency,
            context_len=args.context_len,
            margin_gib=args.margin_gib,
            sglang_version=args.sglang_version,
        )
        if not p.fits or p.runtime_risk
        else []
    )
    if args.json:
        out = p.to_dict()
        out["suggestion"] = options[0].to_dict() if options else None
        out["alternatives"] = [o.to_dict() for o in options[1:]]
        print(json.dumps(out, indent=2))
        return 0
    print(p.explain())
    for i, o in enumerate(options):
        label = "Suggested" if i == 0 else "Alternative"
        print(f"{label}: {o.as_flags(args.sglang_version)} -- {o.why}")
    return 0


def _vllm_preflight(args: argparse.Namespace, engine: Engine) -> int:
    """vLLM's preflight: on a GPU ``--hardware`` profile, or on the memory of ``--host`` (this machine by
    default), with the model read where it lives."""
    import json

    from dsv4lab.model.vllm_memory import vllm_preflight

    for flag, value in (
        ("--model", args.model),
        ("--concurrency", args.concurrency),
        ("--context-len", args.context_len),
    ):
        if value is not None:
            raise ConfigError(flag, value, "only with --engine sglang (vLLM's preflight reads the model's config.json)")
    if args.host and args.hardware:
        raise ConfigError(
            "--hardware", args.hardware, "either --hardware (a GPU profile) or --host (that host's memory), not both"
        )
    config = _config_from_args(args, engine)
    version = engine.resolve_version(args.sglang_version)
    if args.hardware:
        p = vllm_preflight(config, hardware=args.hardware, vllm_version=version)
    else:
        from dsv4lab.serving.hostmem import read_host_memory, read_model_facts

        with _host_from_args(args) as host:
            memory = read_host_memory(host)
            model = read_model_facts(host, config.model_path, env=config.env)
        p = vllm_preflight(config, memory, model=model, vllm_version=version, model_from_path=False)
    print(json.dumps(p.to_dict(), indent=2) if args.json else p.explain())
    return 0


def _host_from_args(args: argparse.Namespace) -> Any:
    from dsv4lab.hosts import open_host

    if not args.host:
        return open_host(None)
    return open_host(args.host, known_hosts=args.known_hosts, trust_unknown_host=args.trust_host_key)


def _cmd_launch(args: argparse.Namespace) -> int:
    import json

    from dsv4lab.engines.base import SessionSettings
    from dsv4lab.serving.launch import launch

    engine = _engine_from_args(args)
    args.twin = engine.rehearsal
    config = _config_from_args(args, engine)
    _check_twin_options(args)
    placement = _placement_from_args(args)
    host = _host_from_args(args)
    # The twin's settings as a Lab session exports them (its hardware, pace, fault, millisecond log stamps).
    twin_env = engine.launch_env(SessionSettings(args.hardware, args.pace, args.fault or None)) if args.twin else None
    handle = launch(
        host,
        config,
        args.run_dir,
        target=engine.name,
        sglang_version=args.sglang_version,
        python=args.python,
        twin_env=twin_env,
        replace_stale=args.replace_stale,
        placement=placement,
    )
    if args.json:
        print(json.dumps(handle.to_dict(), indent=2))
    elif placement is not None:
        job = handle.extra["slurm"]["job_id"]
        print(f"submitted {handle.target} to Slurm via {host.name}: job {job} ({placement.words()})")
        print(f"run dir {handle.run_dir}")
    else:
        print(f"started {handle.target} on {host.name}: launcher PID {handle.launcher_pid}, run dir {handle.run_dir}")
        print(f"next: dsv4lab watch {handle.run_dir}" + (f" --host {args.host}" if args.host else ""))
    return 0


def _placement_from_args(args: argparse.Namespace) -> Any:
    """A Slurm placement when any ``--slurm-*`` or ``--sbatch-arg`` option is given (``SLURM_CONF`` from the
    environment, passed to the Slurm commands on the login host); None for a launch on the host itself (and for a
    verb without these options, such as ``demo``)."""
    import os

    from dsv4lab.serving.slurm import SlurmPlacement

    names = ("slurm_partition", "slurm_gpus", "slurm_time", "slurm_nodes", "slurm_account", "slurm_qos")
    given = [getattr(args, name, None) for name in (*names, "slurm_constraint")]
    given += list(getattr(args, "sbatch_arg", None) or [])
    if all(v is None for v in given):
        return None
    return SlurmPlacement(
        partition=args.slurm_partition,
        gpus_per_node=8 if args.slurm_gpus is None else args.slurm_gpus,
        time_min=60 if args.slurm_time is None else args.slurm_time,
        nodes=1 if args.slurm_nodes is None else args.slurm_nodes,
        account=args.slurm_account,
        qos=args.slurm_qos,
        constraint=args.slurm_constraint,
        sbatch_args=tuple(args.sbatch_arg or ()),
        slurm_conf=os.environ.get("SLURM_CONF") or None,
    )


def _engine_from_args(args: argparse.Namespace) -> Engine:
    """``--engine NAME``, with ``--twin`` its short form for the twin; both at once must agree."""
    if args.engine is None:
        return get_engine("twin" if args.twin else "sglang")
    engine = get_engine(args.engine)
    if args.twin and not engine.rehearsal:
        raise ConfigError("--twin", f"--engine {args.engine}", "--twin alone (it means --engine twin) or --engine")
    return engine


def _check_twin_options(args: argparse.Namespace) -> None:
    """The twin's options, named as typed, before a host is opened (``launch`` checks them again)."""
    import math

    from dsv4lab.config.hardware import hardware_profile
    from dsv4lab.twin.faults import FAULTS, parse_fault

    if not args.twin:
        for flag, value in (("--pace", args.pace), ("--fault", args.fault)):
            if value is not None:
                raise ConfigError(flag, value, "only with --twin (it sets the twin, not SGLang)")
        return
    try:
        hardware_profile(args.hardware)
    except ConfigError as exc:
        raise exc.within("--hardware: ", field="--hardware") from None
    if args.pace is not None and not (math.isfinite(args.pace) and args.pace > 0):
        raise ConfigError(
            "--pace", args.pace, "a positive number of wall seconds per modelled second (0.05 = 20x faster)"
        )
    try:
        parse_fault(args.fault)
    except UnknownNameError as exc:
        raise exc.within("--fault: ", field="--fault") from None
    except ConfigError:
        raise ConfigError("--fault", args.fault, f"one of {', '.join(FAULTS)} (optionally NAME:VALUE)") from None


def _positive(flag: str, value: float) -> None:
    import math

    if not (math.isfinite(value) and value > 0):
        raise ConfigError(flag, value, "a positive number of seconds")


def _cmd_watch(args: argparse.Namespace) -> int:
    import json

    from dsv4lab.serving.launch import attach
    from dsv4lab.serving.watch import wait_ready

    _positive("--timeout", args.timeout)
    _positive("--stall-after", args.stall_after)
    handle = attach(_host_from_args(args), args.run_dir)
    result = wait_ready(
        handle,
        args.timeout,
        stall_after_s=args.stall_after,
        keep_running=args.keep_running,
        progress=not args.json,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(f"{result.headline()}: {result.reason}")
        for line in result.evidence[-20:]:
            print(f"  | {line}")
    return 0 if result.ready else 1


def _cmd_stop(args: argparse.Namespace) -> int:
    from dsv4lab.serving.launch import attach

    if not args.grace >= 0:
        raise ConfigError("--grace", args.grace, "seconds >= 0 between SIGTERM and SIGKILL")
    handle = attach(_host_from_args(args), args.run_dir)
    print(handle.stop(grace_s=args.grace))
    return 0


def _cmd_ps(args: argparse.Namespace) -> int:
    from dsv4lab.serving.launch import attach

    host = _host_from_args(args)
    root = host.home_path(args.root)
    found = host.run(
        ["find", root, "-maxdepth", "3", "-name", "handle.json", "-printf", "%h\\n"], timeout_s=30.0
    ).stdout.split("\n")
    rows = []
    for run_dir in sorted(d for d in found if d):
        try:
            h = attach(host, run_dir)
        except DSV4LabError as exc:
            rows.append(f"{run_dir}  ?  {exc}")
            continue
        job = h.job()
        if job is not None:
            state = f"{job.state} ({job.reason_words()})" if job.pending else job.state
            rows.append(f"{run_dir}  {h.target:<6}  port {h.port:<5}  slurm job {job.job_id:<7}  {state}")
            continue
        alive = h.is_alive()
        status = "running" if alive else f"exited {h.exit_status()}"
        rows.append(f"{run_dir}  {h.target:<6}  port {h.port:<5}  pid {h.launcher_pid:<7}  {status}")
    print("\n".join(rows) if rows else f"no dsv4lab runs under {root}")
    return 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    import json

    from dsv4lab.logs.source import sniff_binary
    from dsv4lab.model.diagnosis import diagnose_with_model

    try:
        with open(args.logfile, "rb") as f:
            head = f.read(8192)
    except OSError as exc:
        raise ConfigError("LOGFILE", args.logfile, "a readable log file", detail=exc.strerror or str(exc)) from None
    if sniff_binary(head):
        raise ConfigError("LOGFILE", args.logfile, "a text server log", detail="it looks binary: NUL or control bytes")
    d = diagnose_with_model(
        args.logfile, hardware=args.hardware, model=args.model, calibration_logs=tuple(args.calibrate or ())
    )
    if args.json:
        print(json.dumps(d.to_dict(), indent=2))
        return 0
    print(
        f"{d.outcome.value.upper()} ({d.phase.value if d.phase else 'phase unknown'}, "
        f"confidence {d.confidence:.2f}): {d.cause}"
    )
    for note in d.notes:
        print(f"note: {note}")
    for i, fix in enumerate(d.fixes, 1):
        print(f"fix {i}: {fix.change} -- {fix.why}")
    if d.evidence:
        print("evidence:")
        for line in d.evidence[-25:]:
            print(f"  | {line}")
    return 0


def _params(items: Sequence[Sequence[str]]) -> dict[str, Any]:
    """``-p NAME VALUE`` pairs; values read as JSON when they parse, ``1,16`` as a list, else text."""
    from dsv4lab.notebook.nbrun import parse_cli_value

    return {name: parse_cli_value(value) for name, value in items}


def _cmd_run(args: argparse.Namespace) -> int:
    from dsv4lab.errors import Interrupted, NotebookError
    from dsv4lab.notebook.nbrun import NotebookRun, notebook_parameters, run_notebook

    if args.params:
        for p in notebook_parameters(args.notebook).values():
            print(f"{p.name}: {p.type_name} = {p.default}  # {p.help}")
        return 0
    _positive("--timeout", args.timeout)
    try:
        run = run_notebook(
            args.notebook,
            _params(args.p),
            reports_root=args.reports,
            execution_timeout_s=args.timeout,
            log_output=args.log_output,
            trust_host_key=args.trust_host_key,
        )
    except NotebookError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        if exc.run is not None and exc.run.report.exists():
            print(exc.run.report)
        return exc.exit_code
    except Interrupted as exc:  # the report of what ran is written: say where
        print(f"Interrupted: {exc}", file=sys.stderr)
        if isinstance(exc.partial, NotebookRun):
            print(exc.partial.report)
        return exc.exit_code
    print(run.report)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    """Render report.html of a run dir (or index.html of a campaign folder) again, without running anything."""
    from dsv4lab.notebook.campaign import STATE_FILE, rerender_index
    from dsv4lab.notebook.nbrun import render_run

    path = Path(args.path).expanduser()
    if (path / STATE_FILE).is_file():
        print(rerender_index(path))
    elif (path / "notebook.ipynb").is_file():
        print(render_run(path))
    else:
        raise ConfigError(
            "PATH",
            str(path),
            "a run dir of dsv4lab run (with notebook.ipynb) or a campaign folder (with campaign.json)",
        )
    return 0


def _cmd_campaign(args: argparse.Namespace) -> int:
    from dsv4lab.errors import Interrupted, NotebookError
    from dsv4lab.notebook.campaign import CampaignResult, load_campaign, run_campaign

    campaign = load_campaign(args.file).with_parameters(_params(args.p))

    def announce(step: Any) -> None:
        print(f"[{step.id}] {Path(step.notebook).stem}", file=sys.stderr, flush=True)

    _positive("--timeout", args.timeout)
    try:
        result = run_campaign(
            campaign,
            reports_root=args.reports,
            force=args.force,
            execution_timeout_s=args.timeout,
            log_output=args.log_output,
            on_step=announce,
            trust_host_key=args.trust_host_key,
            slurm=_placement_from_args(args),
            max_parallel=args.max_parallel,
        )
    except NotebookError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        if exc.run is not None:
            print(exc.run.index)
        return exc.exit_code
    except Interrupted as exc:
        print(f"Interrupted: {exc}", file=sys.stderr)
        if isinstance(exc.partial, CampaignResult):
            print(exc.partial.index)
        return exc.exit_code
    for step in result.steps:
        reused = " (reused)" if step.reused else ""
        print(f"{step.id:<10} {step.status}{reused:<9} {step.report}", file=sys.stderr)
    print(result.index)
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from dsv4lab.notebook.nbrun import notebook_parameters, parse_cli_value
    from dsv4lab.notebook.sweeps import load_points, run_sweep

    declared = notebook_parameters(args.notebook)
    grid: dict[str, list[Any]] = {}
    fixed: dict[str, Any] = {}
    for name, value in args.p:
        parsed = parse_cli_value(value)
        list_param = name in declared and declared[name].type_name == "list"  # a list is its value, not a grid
        if isinstance(parsed, list) and not list_param:
            grid[name] = parsed
        else:
            fixed[name] = parsed
    _positive("--timeout", args.timeout)
    points = load_points(args.points) if args.points else None
    if not grid and points is None:
        allowed = "a swept parameter with several values (-p mem_fraction_static 0.55,0.6) or --points FILE.toml"
        raise ConfigError("-p", "", allowed)
    result = run_sweep(
        args.notebook,
        grid if points is None else None,
        points=points,
        parameters=fixed,
        reports_root=args.reports,
        run_predicted_oom=args.run_predicted_oom,
        execution_timeout_s=args.timeout,
        trust_host_key=args.trust_host_key,
        slurm=_placement_from_args(args),
        max_parallel=args.max_parallel,
        resume=args.resume,
    )
    print(result.text_table())
    print(result.index)
    return 0 if all(p.status in ("ok", "skipped") for p in result.points) else 1


def _cmd_tune(args: argparse.Namespace) -> int:
    """``dsv4lab tune``: the base config and the space, checked; the tuning run; its JSON and index last."""
    import datetime as dt
    import json

    from dsv4lab.notebook.lab import Lab

    engine = _engine_from_args(args)
    base = _config_from_args(args, engine)
    _positive("--timeout", args.timeout)
    placement = _placement_from_args(args)
    # Made by the tuning run once everything is checked: a refused command leaves nothing behind.
    folder = Path(args.reports).resolve() / f"{dt.datetime.now():%Y%m%d-%H%M%S}-tune"
    lab = Lab(
        args.host or "local",
        target=engine.name,
        hardware=args.hardware,
        version=args.version,
        pace=args.pace,
        python=args.python,
        run_root=folder,
        seed=args.seed,
        progress=not args.json,
        known_hosts=args.known_hosts,
        trust_host_key=args.trust_host_key,
        slurm=placement,
    )
    try:
        result = lab.tune(
            base,
            args.space,
            objective=args.objective,
            concurrency=args.concurrency,
            slo=args.slo,
            floor=args.floor,
            budget=args.budget,
            seed=args.seed,
            input_len=args.input_len,
            output_len=args.output_len,
            prompts=args.num_prompts,
            max_parallel=args.max_parallel,
            timeout_s=args.timeout,
            folder=folder,
            name=args.preset or (Path(args.file).stem if args.file else "config_a"),
        )
    finally:
        lab.close()
    if args.json:
        print(json.dumps(result.to_dict(), default=str))
    else:
        best = result.best
        said = (
            f"{plural(result.launches, 'launch', 'launches')} of {plural(result.grid_size, 'point')}; "
            f"{len(result.ruled_out)} ruled out"
        )
        if best is not None:
            said += f"; best: trial {best.number}, {best.label}: {best.score:,.2f} {result.objective.unit}"
        print(said, file=sys.stderr)
    print(result.index)
    return 0 if result.best is not None else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    args.file, args.force, args.max_parallel = None, False, 1
    if args.pace is not None:
        args.p = [*args.p, ["pace", str(args.pace)]]
    return _cmd_campaign(args)


def _cmd_lab(args: argparse.Namespace) -> int:
    from dsv4lab.notebook.labserver import run_lab

    return run_lab(args.port, args.notebooks)


def _cmd_bench(args: argparse.Namespace) -> int:
    from dsv4lab.cli.bench import bench_main

    return bench_main(args.bench_args)


def _add_notebook_options(p: argparse.ArgumentParser, *, help_p: str = "a notebook parameter (repeatable)") -> None:
    p.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"), help=help_p)
    p.add_argument("--reports", default="reports", help="folder the run dirs go under (default: reports)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one notebook cell may run")
    p.add_argument("--log-output", action="store_true", help="echo each cell's output while it runs")
    p.add_argument(
        "--trust-host-key",
        action="store_true",
        help="record the host's UNKNOWN key in ~/.ssh/known_hosts (check its fingerprint first); changed keys are "
        "refused. The host is connected to before anything starts either way",
    )


def build_parser() -> argparse.ArgumentParser:
    """Every verb's parser in one tree: the command line, its ``--help`` and the docs' CLI page are built from
    it, so they cannot disagree."""
    import dsv4lab

    parser = ArgumentParser(prog="dsv4lab", description=(dsv4lab.__doc__ or "").splitlines()[0] or None)
    parser.add_argument("--version", action="version", version=f"dsv4lab {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    for add_verb in _VERBS:
        add_verb(verbs)
    return parser


_Verbs: TypeAlias = "argparse._SubParsersAction[ArgumentParser]"  # the subcommands of the dsv4lab parser


def _config_verb(verbs: _Verbs) -> None:
    config = verbs.add_parser("config", help="show, render and compare server configs")
    cverbs = config.add_subparsers(dest="config_verb", required=True, metavar="ACTION")

    show = cverbs.add_parser("show", help="print a config")
    _add_config_source(show)
    show.add_argument("--format", choices=["table", "toml", "json"], default="toml")
    show.set_defaults(func=_cmd_config_show)

    render = cverbs.add_parser("render", help="print the launch script, argv or env file for an SGLang release")
    _add_config_source(render)
    render.add_argument("--sglang-version", default=None, help="release to render for (default: newest known)")
    render.add_argument("--what", choices=["script", "argv", "env"], default="script")
    render.add_argument("--target", choices=["sglang", "twin"], default="sglang")
    render.add_argument("--python", default="python3", help="interpreter on the host that runs the server")
    render.add_argument(
        "--run-dir", default="~/dsv4lab-runs/run", help="run directory on the host (~/ = the host user home)"
    )
    render.set_defaults(func=_cmd_config_render)

    d = cverbs.add_parser("diff", help="list what changed from config A to config B")
    d.add_argument("a", help="preset name or .toml/.json file")
    d.add_argument("b", help="preset name or .toml/.json file")
    d.set_defaults(func=_cmd_config_diff)

    fields = cverbs.add_parser("fields", help="list every config field with its help")
    fields.set_defaults(func=_cmd_config_fields)


def _bench_verb(verbs: _Verbs) -> None:
    # Its own parser (dsv4lab.cli.bench_args) reads the rest of the line.
    be = verbs.add_parser(
        "bench", help="load-benchmark a server (see dsv4lab bench --help)", add_help=False, prefix_chars="\0"
    )
    be.add_argument("bench_args", nargs=argparse.REMAINDER)
    be.set_defaults(func=_cmd_bench)


def _preflight_verb(verbs: _Verbs) -> None:
    pf = verbs.add_parser("preflight", help="predict whether a config fits in memory, and what would fail")
    _add_config_source(pf)
    pf.add_argument(
        "--engine",
        choices=[n for n in ENGINE_NAMES if n != "twin"],
        default=None,
        help="whose memory split: sglang (default; on --hardware) or vllm (on --hardware, or --host's memory)",
    )
    add_host_options(pf)
    pf.add_argument(
        "--hardware",
        default=None,
        help="hardware profile (see dsv4lab.config.hardware; SGLang's default rtx-pro-6000-x8); with --engine "
        "vllm and no --hardware, the memory of --host (default: this machine)",
    )
    pf.add_argument("--model", default=None, help="SGLang model profile (default: from the config's model_path)")
    pf.add_argument("--sglang-version", default=None, help="release whose memory behaviour to model (vLLM's too)")
    pf.add_argument("--concurrency", type=int, default=None, help="largest concurrency you will serve (SGLang)")
    pf.add_argument("--context-len", type=int, default=None, help="context per request the KV pool must hold (SGLang)")
    pf.add_argument("--margin-gib", type=float, default=4.0, help="GiB a suggestion must leave free (SGLang)")
    pf.add_argument("--json", action="store_true", help="print one JSON object")
    pf.set_defaults(func=_cmd_preflight)


def _diagnose_verb(verbs: _Verbs) -> None:
    dg = verbs.add_parser("diagnose", help="read a server log: outcome, phase, cause, evidence and fixes")
    dg.add_argument("logfile")
    dg.add_argument("--json", action="store_true", help="print one JSON object")
    dg.add_argument("--hardware", default=None, help="hardware profile for the memory model (default: from the log)")
    dg.add_argument("--model", default=None, help="model profile (default: from the logged model path)")
    dg.add_argument("--calibrate", action="append", metavar="LOG", help="fit graph memory from this log first")
    dg.set_defaults(func=_cmd_diagnose)


def _launch_verb(verbs: _Verbs) -> None:
    la = verbs.add_parser("launch", help="start a server (or the twin) in a run directory and return at once")
    _add_config_source(la)
    add_host_options(la)
    la.add_argument("--run-dir", required=True, help="run directory on the host")
    la.add_argument(
        "--engine",
        choices=ENGINE_NAMES,
        default=None,
        help="what to start: the SGLang twin (no GPU), SGLang, or vLLM (default: sglang)",
    )
    la.add_argument("--twin", action="store_true", help="short for --engine twin")
    la.add_argument("--hardware", default="rtx-pro-6000-x8", help="twin hardware profile")
    _add_pace(la)
    la.add_argument("--fault", default=None, help="twin fault to inject")
    la.add_argument("--sglang-version", default=None, help="SGLang release to render flags for")
    la.add_argument(
        "--python",
        default=None,
        help="the server host's interpreter, e.g. ~/venvs/sglang/bin/python (default: python3; this one for a "
        "local twin); checked before launch",
    )
    la.add_argument("--replace-stale", action="store_true", help="kill a server already holding the port")
    la.add_argument("--json", action="store_true")
    _add_slurm_options(la)
    la.set_defaults(func=_cmd_launch)


def _add_slurm_options(p: argparse.ArgumentParser) -> None:
    """The job shape of a launch on a Slurm cluster (``--host`` is then its login host; ``SLURM_CONF`` from the
    environment is passed to the Slurm commands there)."""
    g = p.add_argument_group("Slurm (submit the launch as a batch job; --host is the login host)")
    g.add_argument("--slurm-partition", default=None, help="partition (default: the cluster's default)")
    g.add_argument("--slurm-gpus", type=int, default=None, help="GPUs per node (--gres=gpu:N; default 8)")
    g.add_argument("--slurm-time", type=int, default=None, help="time limit in whole minutes (default 60)")
    g.add_argument(
        "--slurm-nodes",
        type=int,
        default=None,
        help="nodes (default 1); above 1, an SGLang server spanning them (its nnodes)",
    )
    g.add_argument("--slurm-account", default=None, help="account to charge")
    g.add_argument("--slurm-qos", default=None, help="quality of service")
    g.add_argument("--slurm-constraint", default=None, help="node features the job needs")
    g.add_argument(
        "--sbatch-arg", action="append", default=None, metavar="ARG", help="one more sbatch option, as --opt=value"
    )


def _watch_verb(verbs: _Verbs) -> None:
    wa = verbs.add_parser("watch", help="wait until the server in RUN_DIR is ready, or say why it is not")
    wa.add_argument("run_dir")
    add_host_options(wa)
    wa.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for READY")
    wa.add_argument("--stall-after", type=float, default=300.0, help="seconds without a log line = STALLED")
    wa.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the server running on Ctrl-C, and after a fatal error it logged while still running",
    )
    wa.add_argument("--json", action="store_true", help="print one JSON object")
    wa.set_defaults(func=_cmd_watch)


def _stop_verb(verbs: _Verbs) -> None:
    st = verbs.add_parser("stop", help="end the server's whole process tree")
    st.add_argument("run_dir")
    add_host_options(st)
    st.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    st.set_defaults(func=_cmd_stop)


def _ps_verb(verbs: _Verbs) -> None:
    ps = verbs.add_parser("ps", help="list dsv4lab runs and whether they are alive")
    add_host_options(ps)
    ps.add_argument("--root", default="~/dsv4lab-runs", help="folder holding run directories")
    ps.set_defaults(func=_cmd_ps)


def _report_verb(verbs: _Verbs) -> None:
    rep = verbs.add_parser(
        "report", help="write report.html of a run dir (or index.html of a campaign folder) again, running nothing"
    )
    rep.add_argument("path", help="reports/<time>-<notebook> or reports/<campaign>")
    rep.set_defaults(func=_cmd_report)


def _run_verb(verbs: _Verbs) -> None:
    run = verbs.add_parser("run", help="run one experiment notebook headlessly into reports/, with its HTML report")
    run.add_argument("notebook", help="a shipped notebook (01_config_a_baseline ... or just 01) or a .ipynb path")
    _add_notebook_options(run)
    run.add_argument("--params", action="store_true", help="list the notebook's parameters and exit")
    run.set_defaults(func=_cmd_run)


def _campaign_verb(verbs: _Verbs) -> None:
    camp = verbs.add_parser("campaign", help="run the campaign's notebooks in order; prints its index.html last")
    camp.add_argument("file", nargs="?", default=None, help="campaign .toml (default: the story's, on the twin)")
    _add_notebook_options(camp, help_p="change a campaign-wide parameter, e.g. -p host gpubox -p target sglang")
    camp.add_argument("--force", action="store_true", help="rerun steps that already finished with these parameters")
    camp.add_argument(
        "--max-parallel",
        type=int,
        default=1,
        help="steps at once, each as soon as the steps it takes inputs from are done (more than 1 needs a Slurm "
        "placement: --slurm-* or -p slurm)",
    )
    _add_slurm_options(camp)
    camp.set_defaults(func=_cmd_campaign)


def _sweep_verb(verbs: _Verbs) -> None:
    sw = verbs.add_parser("sweep", help="run a notebook over a grid of parameters; prints the sweep's index last")
    sw.add_argument("notebook", help="a shipped notebook or a .ipynb path")
    _add_notebook_options(sw, help_p="a parameter; comma-separated values are swept (config fields go to overrides)")
    sw.add_argument("--points", default=None, help="a TOML file of [[point]] tables to run instead of a grid")
    sw.add_argument("--run-predicted-oom", action="store_true", help="also run points the memory model says OOM")
    sw.add_argument(
        "--max-parallel", type=int, default=1, help="points at once (more than 1 needs --slurm-*: Slurm places them)"
    )
    sw.add_argument(
        "--resume",
        default=None,
        metavar="SWEEP_DIR",
        help="finish an earlier sweep in its folder: its finished points are kept, the rest (failed, interrupted, "
        "cancelled or timed out by Slurm) run again",
    )
    _add_slurm_options(sw)
    sw.set_defaults(func=_cmd_sweep)


def _tune_verb(verbs: _Verbs) -> None:
    tu = verbs.add_parser(
        "tune",
        help="search config fields for the best config in a few launches (the memory model rules out, Optuna picks); "
        "prints the index last",
    )
    _add_config_source(tu)
    add_host_options(tu)
    tu.add_argument("--engine", choices=ENGINE_NAMES, default=None, help="what to launch (default: sglang)")
    tu.add_argument("--twin", action="store_true", help="short for --engine twin")
    tu.add_argument(
        "--space",
        action="append",
        required=True,
        metavar="FIELD=RANGE|VALUES",
        help="a field to search (repeatable): lo:hi[:step] (five steps when none is given) or v1,v2,...",
    )
    tu.add_argument(
        "--objective", default="throughput", help="throughput (per GPU), goodput (needs --slo) or interactivity"
    )
    tu.add_argument("--slo", action="append", default=[], metavar="NAME=MS", help="e.g. tpot_p99_ms=400 (repeatable)")
    tu.add_argument("--floor", type=float, default=None, help="interactivity: least output tok/s per GPU")
    tu.add_argument("--concurrency", default="16", help="levels to benchmark each trial at, e.g. 1,16")
    tu.add_argument("--budget", type=int, default=8, help="most launches")
    tu.add_argument("--seed", type=int, default=0, help="the sampler's and the workload's seed")
    tu.add_argument("--input-len", type=int, default=8000, help="prompt tokens per request")
    tu.add_argument("--output-len", type=int, default=256, help="output tokens per request")
    tu.add_argument("--num-prompts", type=int, default=None, help="requests per level (default: one wave)")
    tu.add_argument("--hardware", default=None, help="hardware profile (default: the story's 8 x RTX PRO 6000)")
    tu.add_argument("--version", default=None, help="the engine release whose flags to render")
    _add_pace(tu)
    tu.add_argument("--python", default=None, help="the server host's interpreter")
    tu.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for each trial's READY")
    tu.add_argument("--max-parallel", type=int, default=1, help="trials at once (more than 1 needs --slurm-*)")
    tu.add_argument("--reports", default="reports", help="folder the tuning run's folder goes under")
    tu.add_argument("--json", action="store_true", help="one JSON object of the result before the index path")
    _add_slurm_options(tu)
    tu.set_defaults(func=_cmd_tune)


class _OldPace(argparse.Action):
    """``--time-scale``, the old name of ``--pace``: still taken for one release, with a line saying so."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any, opt: Any = None) -> None:
        print("warning: --time-scale is deprecated and goes in the next release; use --pace", file=sys.stderr)
        ns.pace = values


def _add_pace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pace",
        type=float,
        default=None,
        metavar="SCALE",
        help="pace the twin: wall seconds per modelled second (default: virtual time, as fast as this machine "
        "computes, the same figures on any machine)",
    )
    parser.add_argument("--time-scale", type=float, dest="pace", action=_OldPace, help="the old name of --pace")


def _demo_verb(verbs: _Verbs) -> None:
    demo = verbs.add_parser("demo", help="the story's campaign on the twin (what make demo runs)")
    demo.add_argument("--reports", default="reports", help="folder the campaign writes under")
    _add_pace(demo)
    demo.add_argument("--log-output", action="store_true", help="echo each cell's output while it runs")
    demo.add_argument(
        "-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"), help="a campaign parameter"
    )
    demo.set_defaults(func=_cmd_demo, timeout=3600.0, trust_host_key=False)


def _lab_verb(verbs: _Verbs) -> None:
    lab = verbs.add_parser("lab", help="JupyterLab on the notebooks, on 127.0.0.1 with a fresh token (prints its URL)")
    lab.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    lab.add_argument("--notebooks", default=None, help="folder to open (default: a copy in ./dsv4lab-notebooks)")
    lab.set_defaults(func=_cmd_lab)


#: The verbs in the order ``dsv4lab --help`` lists them; each adds its subparser (and its own subcommands).
_VERBS: tuple[Callable[[_Verbs], None], ...] = (
    _config_verb,
    _bench_verb,
    _preflight_verb,
    _diagnose_verb,
    _launch_verb,
    _watch_verb,
    _stop_verb,
    _ps_verb,
    _report_verb,
    _run_verb,
    _campaign_verb,
    _sweep_verb,
    _tune_verb,
    _demo_verb,
    _lab_verb,
)


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so long verbs (demo, watch) stop the servers they started."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit status (``argv`` defaults to the process's arguments). SIGTERM is
    handled as Ctrl-C, so a killed command still stops what it started."""
    import signal
    import threading

    parser = build_parser()
    args = parser.parse_args(argv)
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt) if in_main else None
    try:
        return _run(args)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            status = int(args.func(args))
        except DSV4LabError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            status = exit_code_for(exc)
        except BrokenPipeError:  # e.g. `dsv4lab ... | head`: the reader left, nothing to report
            sys.stderr.close()
            return 0
        except KeyboardInterrupt:
            print("Interrupted.", file=sys.stderr)
            return 130
    for w in caught:
        print(f"Note: {w.message}", file=sys.stderr)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
