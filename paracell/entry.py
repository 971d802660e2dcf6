"""Console-script entry: runs the click group and turns every failure into one
line on stderr (and in --log), with a non-zero exit, never a traceback."""

from __future__ import annotations

import sys


def _log_from_argv(argv: list[str]) -> object:
    from paracell.fastpath import split_globals
    from paracell.log import RuntimeLog

    opts = (split_globals(argv) or ({}, []))[0]
    return RuntimeLog(opts.get("--log") or None, opts.get("--log-format") or "text")


def main(argv: list[str] | None = None) -> None:
    from paracell import fastpath

    args = sys.argv[1:] if argv is None else argv
    status = fastpath.run(args)
    if status is not None:
        sys.exit(status)

    import click

    from paracell.cli import main as group
    from paracell.errors import ParacellError

    try:
        group.main(args=args, prog_name="paracell", standalone_mode=False)
    except ParacellError as err:
        _log_from_argv(args).error(str(err))  # type: ignore[attr-defined]
        sys.exit(err.exit_code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as err:
        _log_from_argv(args).error(err.format_message())  # type: ignore[attr-defined]
        sys.exit(err.exit_code)
    except (click.Abort, KeyboardInterrupt):
        sys.exit(130)
    except OSError as err:
        where = f" {err.filename}" if err.filename else ""
        _log_from_argv(args).error(f"{err.strerror or err}{':' if where else ''}{where}")  # type: ignore[attr-defined]
        sys.exit(1)
    except Exception as err:  # a defect of ours: still one line, never a traceback
        _log_from_argv(args).error(f"internal error: {type(err).__name__}: {err}")  # type: ignore[attr-defined]
        sys.exit(1)
