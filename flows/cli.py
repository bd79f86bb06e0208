"""`rollflow` command line. Flags are derived from the config models (slime's names), parsed and
validated before Ray or Prefect is imported, so a bad flag costs nothing."""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from config import SECTIONS, RunConfig, load_yaml
from config.location import recorded_run_dir, relocate
from config.stages import REPLAYABLE, check_stages


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _parser_type(annotation: Any) -> tuple[Any, list[Any] | None, bool, bool]:
    """(converter, choices, optional, is_list) for a field annotation."""
    args = typing.get_args(annotation)
    optional = type(None) in args
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in args if a is not type(None))
    if typing.get_origin(annotation) is Literal:
        return str, list(typing.get_args(annotation)), optional, False
    if typing.get_origin(annotation) is list:
        return typing.get_args(annotation)[0], None, optional, True
    if typing.get_origin(annotation) is dict or annotation is dict:
        return _json_object, None, optional, False
    return annotation, None, optional, False


def _json_object(text: str) -> dict[str, Any]:
    """A flag value that is a JSON object (e.g. --apply-chat-template-kwargs '{"enable_thinking": false}')."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg} at column {e.colno}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}: {text!r}")
    return value


def _add_model_flags(parser: argparse.ArgumentParser, model: type[BaseModel], prefix: str) -> None:
    group = parser.add_argument_group(prefix or "run")
    for name, info in model.model_fields.items():
        if name in SECTIONS:
            continue
        dest = f"{prefix}.{name}" if prefix else name
        conv, choices, optional, is_list = _parser_type(info.annotation)
        default = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
        help_text = f"{info.description} (default: {default})"
        if conv is bool:
            group.add_argument(
                flag(name), dest=dest, action="store_true", default=argparse.SUPPRESS, help=help_text
            )
            continue

        def convert(text: str, conv=conv, optional=optional, is_list=is_list):
            if optional and not is_list and text.lower() == "none":
                return None
            return conv(text)

        group.add_argument(
            flag(name),
            dest=dest,
            type=convert,
            choices=choices,
            default=argparse.SUPPRESS,
            nargs="+" if is_list else None,
            metavar=(name.split("_")[-1].upper() if not choices else None),
            help=help_text,
        )


# run flags that are not config fields: what to do with the config, and --wandb-key (a secret: it goes to the
# environment, never into config.yaml)
CLI_ONLY = (
    "command",
    "config",
    "refresh",
    "cron",
    "interval",
    "dry_run",
    "resume",
    "overwrite",
    "verbose",
    "wandb_key",
)


def build_config(args: argparse.Namespace) -> RunConfig:
    """YAML file (if any) overlaid with the flags given; raises ValueError naming the flag."""
    data: dict[str, Any] = load_yaml(args.config) if getattr(args, "config", None) else {}
    for dest, value in vars(args).items():
        if dest in CLI_ONLY:
            continue
        section, _, name = dest.rpartition(".")
        target = data.setdefault(section, {}) if section else data
        target[name] = value
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ValueError("; ".join(_describe(err) for err in e.errors())) from None


def _describe(err: Any) -> str:
    """One pydantic error as "--flag: message (got value)", the message and the value bounded (a value can be
    as long as a config file makes it)."""
    from config.yaml_file import bounded, quote

    loc = [str(x) for x in err["loc"]]
    # pydantic's prefix for a validator's ValueError
    message = bounded(err["msg"].removeprefix("Value error, "))
    if not loc:
        return message
    return f"{flag(loc[-1])}: {message}" + (f" (got {quote(err['input'])})" if "input" in err else "")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run the RL loop (one Prefect flow run per rollout id)",
        allow_abbrev=False,  # a slime flag rollflow lacks must not be taken for a longer flag it has
        epilog="Defaults are slime's (slime/utils/arguments.py, and Megatron's where slime keeps them). A run on a "
        "recipe's own data (no --prompt-data) takes the recipe's tuned values for what the flags leave unset: "
        "--n-samples-per-prompt 4, --lr 2e-4, --lr-decay-style cosine, --kl-loss-type low_var_kl, "
        "--weight-decay 0, --micro-batch-size none, --global-batch-size 128, --eval-interval 10, "
        "--n-samples-per-eval-prompt 4. slime has no default for --num-rollout, --rollout-batch-size and "
        "--rollout-max-response-len (100, 128, 6 here: set them for your data); --global-batch-size is "
        "Megatron's, --micro-batch-size x DP, unless given. slime's --sglang-* flags are "
        "kept for an SGLang engine; architecture flags (--num-layers, ...) are checked against config.json.",
    )
    run.add_argument("--config", help="YAML file with the config (nested by section); flags override it")
    run.add_argument("--refresh", default="", help="comma-separated stages to re-run even when cached")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="validate flags, resolve and read the data, print the resolved config; start nothing",
    )
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (killed, crashed or stopped) with its config.yaml, from its "
        "last completed rollout; the finished run equals an uninterrupted one",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the records of another run in the run dir (otherwise such a run dir is refused)",
    )
    run.add_argument(
        "--verbose",
        action="store_true",
        help="the full console: Prefect's log lines (task states, the `rollout N: {...}` records) and "
        "the actors' output, as logs/run.log and logs/actors.log in the run dir hold them; "
        "default: a progress bar (on a terminal), one line per rollout and a summary table",
    )
    run.add_argument(
        "--wandb-key",
        metavar="KEY",
        help="W&B API key: sets WANDB_API_KEY for this run (slime's wandb.login key); never written to config.yaml",
    )
    _add_model_flags(run, RunConfig, "")
    for name, model in SECTIONS.items():
        _add_model_flags(run, model, name)
    replay = sub.add_parser("replay", help="re-run one stage of a past rollout and compare with the original")
    replay.add_argument("run_dir", help="the run directory (holds config.yaml)")
    replay.add_argument("--rollout-id", type=int, required=True)
    replay.add_argument("--task", required=True, choices=list(REPLAYABLE))
    replay.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="change the config for the replay (e.g. train.entropy_coef=0.01); repeatable",
    )
    diff = sub.add_parser(
        "diff", help="the first divergence between two runs (samples, metrics, layer hashes)"
    )
    diff.add_argument("run_a")
    diff.add_argument("run_b")
    doctor = sub.add_parser(
        "doctor",
        help="name what is wrong with a run: ranked findings with evidence and the "
        "knife that confirms each (exit 1 on an error)",
    )
    doctor.add_argument("run_dir", help="the run directory (holds config.yaml and metrics.jsonl)")
    doctor.add_argument("--strict", action="store_true", help="exit 1 on warnings too, not only on errors")
    lint = sub.add_parser(
        "lint-ckpt",
        help="check a safetensors checkpoint against its index and config.json "
        "(shards, tensors, dtypes, shapes, tied embeddings, quantisation)",
    )
    lint.add_argument("path", help="an HF model dir, a --save dir (every iter_* in it) or an iter_* dir")
    inspect = sub.add_parser(
        "inspect", help="print metrics and samples of a recording (.parquet or slime .pt)"
    )
    inspect.add_argument("path")
    inspect.add_argument(
        "--fields",
        default="sample_index,prompt,response,label,reward,status",
        help="comma-separated sample fields to print",
    )
    inspect.add_argument("--limit", type=int, default=8, help="samples to print")
    inspect.add_argument(
        "--trust-pickle", action="store_true", help="allow .pt files that need arbitrary unpickling"
    )
    convert = sub.add_parser("convert", help="convert a recording between .parquet and slime .pt")
    convert.add_argument("src")
    convert.add_argument("dst")
    convert.add_argument(
        "--trust-pickle", action="store_true", help="allow .pt files that need arbitrary unpickling"
    )
    serve = sub.add_parser(
        "serve", help="serve the run flow and the replay flow as deployments (UI runs, schedules)"
    )
    serve.add_argument("--config", help="YAML file with the deployment's default config")
    serve.add_argument("--cron", help="cron schedule (needs a real Prefect server)")
    serve.add_argument("--interval", type=int, help="run every N seconds (needs a real Prefect server)")
    tpl = sub.add_parser(
        "check-template", help="check that the chat template renders prompts and turns consistently"
    )
    tpl.add_argument(
        "--hf-checkpoint", required=True, help="HF model dir with the tokenizer and its chat template"
    )
    tpl.add_argument(
        "--prompt-data", help="render the first rows of this .jsonl/.parquet file (default: one example)"
    )
    tpl.add_argument("--input-key", default="input")
    tpl.add_argument("--label-key", default=None, help="the label is rendered as the assistant's reply")
    tpl.add_argument("--apply-chat-template-kwargs", type=_json_object, default={})
    tpl.add_argument("--rollout-stop", nargs="+", default=None)
    tpl.add_argument("--rollout-stop-token-ids", nargs="+", type=int, default=None)
    tpl.add_argument("--examples", type=int, default=3, help="rows to render")
    plot = sub.add_parser(
        "plot", help="draw the curves of one or more runs, overlaid, into one .png/.svg/.html"
    )
    plot.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (each holds metrics.jsonl)"
    )
    plot.add_argument(
        "-o",
        "--output",
        default="curves.png",
        help="output file; its extension picks the format: .png, .svg or .html (default: curves.png)",
    )
    plot.add_argument(
        "--size",
        type=_pixels,
        default=(1200, 800),
        metavar="WIDTHxHEIGHT",
        help="figure size in pixels (default: 1200x800)",
    )
    server = sub.add_parser("server", help="start a Prefect server with the UI at http://127.0.0.1:4200")
    server.add_argument("--port", type=int, default=4200)
    server.add_argument(
        "--files-port",
        type=int,
        default=None,
        help="serve the files under the current directory read-only at http://127.0.0.1:FILES_PORT, so the run "
        "pages' file links open from the UI (default: --port + 1; 0: off)",
    )
    server.add_argument(
        "--database-url",
        type=_database_url,
        metavar="URL",
        help="the server's database: postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DB for a shared server "
        "(sets PREFECT_SERVER_DATABASE_CONNECTION_URL; default: that variable, else SQLite under PREFECT_HOME)",
    )
    return parser


# The database drivers Prefect's server runs on (it opens every connection through asyncio)
DATABASE_SCHEMES = ("postgresql+asyncpg", "sqlite+aiosqlite")


def masked_url(url: str) -> str:
    """`url` with the password of its user part replaced by ***, fit to print. Everything up to the last @ is
    the user part, so a password holding an @ stays hidden too."""
    scheme, sep, rest = url.partition("://") if "://" in url.partition("@")[0] else ("", "", url)
    user, at, host = rest.rpartition("@")
    if not (at and ":" in user):
        return url
    return f"{scheme}{sep}{user.split(':', 1)[0]}:***@{host}"


def _database_url(text: str) -> str:
    """`--database-url`: a URL of one of `DATABASE_SCHEMES`, else a one-line refusal that shows it masked."""
    scheme = text.partition("://")[0]
    if "://" not in text or scheme not in DATABASE_SCHEMES:
        raise argparse.ArgumentTypeError(
            f"{masked_url(text)!r} is not a database Prefect's server can use: expected "
            "postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DB or sqlite+aiosqlite:///PATH"
        )
    return text


def _pixels(text: str) -> tuple[int, int]:
    """`--size 1200x800` -> (1200, 800)."""
    width, sep, height = text.lower().partition("x")
    if not (sep and width.isdigit() and height.isdigit()):
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels, e.g. 1200x800, got {text!r}")
    return int(width), int(height)


def _plot(args: argparse.Namespace) -> int:
    """`rollflow plot`: exit 0 with the written path, 2 when a dir is not a run or the format/size is refused."""
    from artifacts.plots import write_plot

    try:
        out = write_plot(args.run_dirs, args.output, size=args.size)
    except (FileNotFoundError, ValueError) as e:
        print(f"rollflow: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


# Set by `configure_prefect_env` unless already set. Every SQLite write of the server can collide with the
# parent creating the next `rollout-<id>` run. SQLite then refuses it ("database is locked", a 503), and
# Prefect's client waits 2 s. So events go to SQLite in batches of 1000 or every 60 s (Prefect: 20 / 5 s).
# Flow runs, logs and artifacts are not events and still reach the server at once. The UI's event feed lags
# by up to 60 s; the server writes the rest when it stops.
# Task runs are events too: the task-run recorder writes them in one batch a second, not once per state
# change (Prefect's batch size 1). The UI shows a task run up to a second late. The run flow waits for its
# last rollout's task runs before it ends.
PREFECT_ENV_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # the client side of the same opt-out: Prefect's SDK printed a 4-line telemetry notice into the console of the
    # first run on a terminal (per PREFECT_HOME)
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "1000",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "60",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "1000",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "RAY_DEDUP_LOGS": "0",
}


# Set by `configure_prefect_env` too, unless already set, for the temporary server a run starts itself (no
# PREFECT_API_URL; not for `rollflow server`): the automations services (triggers and their actions) are off.
# Nobody can define an automation on a server that lives as long as one run. Their consumers would still read
# every event the run sends, on the cores the actors use.
EPHEMERAL_SERVER_DEFAULTS = {
    "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
}


def configure_prefect_env(*, serving: bool = False) -> None:
    """Settings that make the embedded Prefect (and Ray) usable on a small machine. Sets each of
    `PREFECT_ENV_DEFAULTS` that the environment does not already set. Unless `serving` (`rollflow server`) or
    PREFECT_API_URL names a server, also sets each of `EPHEMERAL_SERVER_DEFAULTS` and Prefect's API auth for
    the temporary server this process starts (`temporary_server_auth`). Call before Prefect is imported: it
    reads them then. (Ray's token authentication stays on: tasks/actors.ensure_ray.)"""
    defaults = dict(PREFECT_ENV_DEFAULTS)
    if not serving and not os.environ.get("PREFECT_API_URL"):
        defaults.update(EPHEMERAL_SERVER_DEFAULTS)
        defaults.update(temporary_server_auth())
    for name, value in defaults.items():
        os.environ.setdefault(name, value)


def temporary_server_auth() -> dict[str, str]:
    """The temporary Prefect server a run starts listens on 127.0.0.1, where any local user could reach it. So
    it asks for Prefect's API auth string (PREFECT_SERVER_API_AUTH_STRING). This process's clients send it
    (PREFECT_API_AUTH_STRING), and the processes it starts inherit it. A random one per process, unless the
    environment sets one of them (the other follows it)."""
    import secrets

    given = os.environ.get("PREFECT_SERVER_API_AUTH_STRING") or os.environ.get("PREFECT_API_AUTH_STRING")
    value = given or secrets.token_urlsafe(32)
    return {"PREFECT_SERVER_API_AUTH_STRING": value, "PREFECT_API_AUTH_STRING": value}


def configure_ray_env(ray_address: str | None = None) -> None:
    """Ray's environment for a run, set before `ray` is imported (Ray reads it at import time).
    - Token authentication on (Ray 2.60's default): Ray's GCS, raylet and workers listen on every interface,
      so the token is what keeps other hosts out. A local Ray gets a fresh random token, which its processes
      and workers inherit; a joined cluster uses the user's token.
    - gloo on loopback.
    `RAY_AUTH_MODE=disabled` set by the user is respected as their explicit choice; their own
    GLOO_SOCKET_IFNAME too."""
    import secrets

    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "disabled":
        os.environ["RAY_AUTH_MODE"] = "token"
        if not ray_address:
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def server_command(port: int) -> list[str]:
    """`prefect server start` run by this interpreter: the venv's `prefect` script need not be on PATH
    (`scripts/rollflow` runs the venv's `rollflow` without activating the venv)."""
    return [sys.executable, "-m", "prefect", "server", "start", "--port", str(port), "--analytics-off"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line parsed. For `run`, slime's other --sglang-NAME [VALUE] flags go to
    sglang.sglang_server_args. A flag it lacks ends the program with a one-line error that says what to do:
    a slime flag rollflow cannot honour, or the closest flag's name."""
    parser = make_parser()
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    if args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        server_args = sglang_server_args(extra, getattr(args, "sglang.sglang_server_args", {}))
    except ValueError as e:
        _exit_run_error(str(e))
    if server_args is not None:
        setattr(args, "sglang.sglang_server_args", server_args)
    return args


def sglang_server_args(extra: list[str], held: dict[str, Any]) -> dict[str, Any] | None:
    """`extra` (what `run`'s parser did not know) as SGLang server arguments over `held`: --sglang-NAME VALUE...,
    --sglang-NAME=VALUE or a bare --sglang-NAME switch (True). None when `extra` holds none; ValueError with the
    one-line error for the first token that is no --sglang-* flag."""
    from config.slime_compat import unknown_flag

    out, i = dict(held), 0
    while i < len(extra):
        token = extra[i]
        name, eq, value = token.partition("=")
        if not name.startswith("--sglang-") or name == "--sglang-":
            if token.startswith("-"):
                raise ValueError(unknown_flag(name, _run_flags()))
            raise ValueError(f"unexpected value {token!r}: every `rollflow run` setting is a --flag")
        key = name.removeprefix("--sglang-").replace("-", "_")
        values, i = ([value] if eq else []), i + 1
        while not eq and i < len(extra) and not extra[i].startswith("--"):
            values.append(
                extra[i]
            )  # a list-valued server argument (--sglang-cuda-graph-bs 1 2 4) as its text
            i += 1
        out[key] = " ".join(values) if values else True
    return out


def _run_flags() -> list[str]:
    """Every flag `rollflow run` takes."""
    names = [flag(n) for n in RunConfig.model_fields if n not in SECTIONS]
    names += [flag(n) for model in SECTIONS.values() for n in model.model_fields]
    return names + [
        "--config",
        "--refresh",
        "--dry-run",
        "--resume",
        "--overwrite",
        "--verbose",
        "--wandb-key",
    ]


def _exit_run_error(message: str) -> typing.NoReturn:
    print(f"rollflow: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    began = time.monotonic()  # the run's summary counts its wall time from here
    args = parse_args(argv)
    if args.command == "server":
        configure_prefect_env(serving=True)
        if args.database_url:
            os.environ["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = args.database_url
        if database := os.environ.get("PREFECT_SERVER_DATABASE_CONNECTION_URL"):
            print(f"rollflow server: database {masked_url(database)}", file=sys.stderr)
        # the UI calls the API at PREFECT_UI_API_URL, which Prefect defaults to port 4200 whatever --port says
        os.environ.setdefault("PREFECT_UI_API_URL", f"http://127.0.0.1:{args.port}/api")
        files_port = args.port + 1 if args.files_port is None else args.files_port
        if files_port:
            from flows.files import serve_beside_prefect

            try:
                serve_beside_prefect(args.port, files_port, os.getcwd())
            except (OSError, OverflowError, ValueError) as e:
                print(f"rollflow: error: --files-port {files_port}: {e} (0 turns it off)", file=sys.stderr)
                return 2
        os.execv(sys.executable, server_command(args.port))
    if args.command == "diff":
        from flows.diff import diff_command

        return diff_command(args.run_a, args.run_b)
    if args.command in ("doctor", "lint-ckpt"):
        from flows.doctor.commands import doctor_command, lint_ckpt_command

        return (
            doctor_command(args.run_dir, args.strict)
            if args.command == "doctor"
            else lint_ckpt_command(args.path)
        )
    if args.command in ("inspect", "convert"):
        from flows.inspect import convert_command, inspect_command

        return inspect_command(args) if args.command == "inspect" else convert_command(args)
    if args.command == "plot":
        return _plot(args)
    if args.command == "check-template":
        from flows.template_cmd import check_template_command

        return check_template_command(args)
    if args.command == "replay":
        configure_prefect_env()
        configure_ray_env()
        return _replay(args)
    if args.command == "serve":
        configure_prefect_env()
        configure_ray_env()
        from deployments.serve import refuse_work_pool_deployments, serve_run

        try:
            cfg = RunConfig.model_validate(load_yaml(args.config) if args.config else {})
            refuse_work_pool_deployments(cfg)
        except ValidationError as e:
            print(
                f"rollflow: error: --config {args.config}: {'; '.join(_describe(err) for err in e.errors())}",
                file=sys.stderr,
            )
            return 2
        except ValueError as e:
            print(f"rollflow: error: {e}", file=sys.stderr)
            return 2
        serve_run(cfg, cron=args.cron, interval=args.interval)
        return 0
    if args.wandb_key:
        os.environ["WANDB_API_KEY"] = args.wandb_key
    try:
        cfg = _resumed_config(args) if args.resume else build_config(args)
        notes = _notices(cfg)  # of the flags as given: resolving fills in the rest
        precision = _precision_notice(cfg)  # before resolving turns auto into what it chose
        refresh = [s for s in args.refresh.split(",") if s]
        check_stages(refresh, "--refresh")
        if args.dry_run:
            return _dry_run(cfg, notes)
        configure_prefect_env()
        if not args.verbose:  # Prefect's INFO lines off its console handler, also those it logs at exit
            os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
        configure_ray_env(cfg.ray_address)  # before anything imports ray (it reads these at import time)
        from flows import runtime
        from flows.resolve import resolve

        if not args.resume:
            cfg = runtime.choose_run_dir(cfg)
        cfg, _ = resolve(cfg)  # before Ray and Prefect: every path, row, key and the reward import
        if cfg.ray_address:
            from tasks.ray_address import check_ray_address

            check_ray_address(cfg.ray_address)
        runtime.check_ownership(cfg, resume=bool(args.resume), overwrite=args.overwrite)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"rollflow: error: {e}", file=sys.stderr)
        return 2
    _print_notices(notes)  # once the run is sure to start: a refused one prints only its error
    if precision:
        print(f"rollflow: {precision}", file=sys.stderr)
    from flows.reaper import start_reaper

    start_reaper()  # before Prefect's server and Ray exist: they end with this process, however it ends
    return _run(cfg, refresh, args, began)


def _run(cfg: RunConfig, refresh: list[str], args: argparse.Namespace, began: float) -> int:
    """Run the flow under the console (quiet or `--verbose`); exit 0, or 1 with the root cause as the last line."""
    import asyncio

    from prefect import tags
    from prefect.exceptions import TerminationSignal

    from flows import runtime
    from flows.console import header, open_console
    from flows.failure import failure_line
    from flows.run import run_flow, run_tags

    with open_console(sys.stdout, verbose=args.verbose, began=began) as console:
        console.write(header(cfg, args.verbose))
        try:
            runtime.start_prefect_beside_ray(cfg)
            with tags(*run_tags(cfg)):  # the parent's flow run and its rollout flow runs
                result = asyncio.run(
                    run_flow(cfg, refresh=refresh, resume=bool(args.resume), overwrite=args.overwrite)
                )
        except Exception as e:  # the flow run is already marked Failed in Prefect; say why and exit non-zero
            sys.stdout.flush()
            print(failure_line(e), file=sys.stderr, flush=True)
            return 1
        except (
            KeyboardInterrupt,
            TerminationSignal,
        ) as e:  # stopped: the flow runs are Cancelled (flows/stop.py)
            sys.stdout.flush()
            return _stopped(e)
    if args.verbose:
        print(f"run finished: {result}")
    return 0


def _notices(cfg: RunConfig) -> list[str]:
    """The start-up notice of a run as given (config/slime_compat.py), one line per concern. It names the
    flags the run keeps but does not act on, and the values it takes where slime has no default."""
    from config.slime_compat import notices

    return notices(cfg)


def _precision_notice(cfg: RunConfig) -> str | None:
    from flows.resolve import precision_notice

    return precision_notice(cfg)


def _print_notices(lines: list[str]) -> None:
    for line in lines:
        print(f"rollflow: notice: {line}", file=sys.stderr)


def _stopped(signal: BaseException) -> int:
    """The line of a run stopped by Ctrl-C, SIGTERM or a cancel from Prefect, and its exit code (130, 143, 1);
    `signal` stopped Ray's or Prefect's start-up when no run flow was stopped."""
    from flows import stop

    line = stop.last_line()
    reason = stop.stop_reason() or (stop.CTRL_C if isinstance(signal, KeyboardInterrupt) else stop.SIGTERM)
    print(f"rollflow: {line or f'stopped by {reason} before the run started'}", file=sys.stderr, flush=True)
    return stop.EXIT_CODES[reason]


def _resumed_config(args: argparse.Namespace) -> RunConfig:
    """`run --resume RUN_DIR`: the run's own resolved config, in RUN_DIR; other run flags would change the run."""
    given = [
        flag(d.rpartition(".")[2])
        for d in vars(args)
        if d not in ("command", "config", "refresh", "dry_run", "resume", "overwrite", "verbose", "wandb_key")
    ]
    if args.config:
        given.append("--config")
    if given:
        raise ValueError(
            f"--resume continues the run with its own config.yaml; drop {', '.join(sorted(given))}"
        )
    if args.overwrite:
        raise ValueError("--resume continues a run and --overwrite replaces it: give one of them")
    path = Path(args.resume) / "config.yaml"
    if not path.is_file():
        raise ValueError(f"--resume {args.resume}: not a run directory (no config.yaml)")
    data = load_yaml(path)
    # the run continues where it is now: a moved or copied run dir still records the dir it was made in
    cfg = RunConfig.model_validate(relocate(data, args.resume))
    _refuse_shared_outputs(cfg, recorded_run_dir(data), args.resume)
    return cfg


def _refuse_shared_outputs(cfg: RunConfig, original: Path, given: str) -> None:
    """A copy of a run resumed while the original still holds the same run writes only in the copy: ValueError
    when the copy would write outside its run dir (--save, recordings, dumps), where the original writes too."""
    from artifacts import rundir
    from config.location import OUTPUT_FIELDS, inside

    here = cfg.resolved_run_dir
    if original == here:
        return
    mine, theirs = rundir.read_info(here), rundir.read_info(original)
    if mine is None or theirs is None or mine.run_id != theirs.run_id:
        return
    shared = [
        f"{flag(name)} {value}"
        for section, name in OUTPUT_FIELDS
        if (value := getattr(getattr(cfg, section), name)) and not inside(value, here)
    ]
    if shared:
        raise ValueError(
            f"--resume {given}: a copy of run {mine.run_id}, which {original} still holds, writes "
            f"{', '.join(shared)} outside its run dir, into the original's files; move the run dir instead of "
            f"copying it, or give the copy its own paths in {here / 'config.yaml'}"
        )


def _dry_run(cfg: RunConfig, notes: list[str] | None = None) -> int:
    """`run --dry-run`: resolve everything that can be resolved without building or starting anything, and call
    the reward and every plug-in that needs no engine on a few rows (rollout/reward_check.py,
    rollout/plugin_check.py, trainers/custom_loss.check_loss)."""
    from flows.resolve import apply_recipe, describe, resolve
    from recipes.registry import get_recipe

    tokenizer = None
    if cfg.hf_checkpoint is None and not Path(apply_recipe(cfg, build=False).hf_checkpoint or "").is_dir():
        tokenizer = get_recipe(
            cfg.recipe
        ).tokenizer()  # the recipe's model is not built yet; its tokenizer is
    resolved, source = resolve(cfg, build=False, tokenizer=tokenizer)
    from rollout.plugin_check import check_run_plugins
    from rollout.reward_check import check_run_reward

    # a broken reward or plug-in is named here, before anything starts; a refused dry run prints only its error
    lines = [
        describe(resolved, source),
        check_run_reward(resolved, source),
        *check_run_plugins(resolved, source),
    ]
    if resolved.loss.loss_type == "custom_loss":  # torch only for a loss to call (the probe's tensors)
        from trainers.custom_loss import check_loss, resolve_loss
        from trainers.settings import trainer_settings

        s = trainer_settings(resolved)
        fn = resolve_loss(s.loss_type, s.custom_loss_function_path)
        assert fn is not None
        name = s.custom_loss_function_path or s.loss_type
        lines.append(
            check_loss(fn, name, s.plugin_args, per_token=s.per_token_loss, with_ref=s.need_ref_model)
        )
    print("\n".join(lines))
    _print_notices(notes or [])
    return 0


def _start_replay(run_dir: str, rollout_id: int, task: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Run the replay flow (Prefect and Ray start here)."""
    import asyncio

    from flows.replay import replay_flow

    return asyncio.run(replay_flow(run_dir, rollout_id, task, overrides))  # type: ignore[call-overload]


def _replay(args: argparse.Namespace) -> int:
    import yaml

    from config import yaml_file
    from flows.replay import check_replay

    overrides = {}
    for item in args.override:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"rollflow: error: --override {item!r}: expected SECTION.KEY=VALUE", file=sys.stderr)
            return 2
        try:
            overrides[key] = yaml_file.loads(value)
        except yaml.YAMLError as e:
            print(
                f"rollflow: error: --override {key}: not valid YAML{yaml_file.describe_error(e)}",
                file=sys.stderr,
            )
            return 2
    try:
        check_replay(args.run_dir, args.rollout_id, args.task, overrides)  # before Prefect and Ray start
        result = _start_replay(args.run_dir, args.rollout_id, args.task, overrides)
    except (FileNotFoundError, ValueError) as e:
        print(f"rollflow: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a replay writes only to a replays/ dir of its own: the run loses nothing
        print("\nrollflow: replay stopped by Ctrl-C", file=sys.stderr)
        return 130
    print("identical" if result["identical"] else f"first difference: {result['difference']}")
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
