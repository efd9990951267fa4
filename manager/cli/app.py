"""The Application held in ctx.obj, and the single error handler."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator

import click

from .. import __version__
from ..catalog import Catalog
from ..console import err, user_text
from ..errors import ManagerError


@dataclass
class Application:
    """State shared by every command: where the catalog is (resolved lazily)."""

    catalog_arg: str | None = None
    _catalog: Catalog | None = field(default=None, repr=False)

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog.locate(self.catalog_arg)
        return self._catalog


def _late_catalog(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is None:
        return
    obj = ctx.find_object(Application)
    if obj is not None:
        obj.catalog_arg, obj._catalog = value, None


def accept_catalog_anywhere(group: click.Group) -> None:
    """`overlay list --catalog X` as well as `overlay --catalog X list` (the README says every command
    takes it): each subcommand gets the option too, setting the Application's catalog (eager, so
    the catalog is set before the other parameters, whose choices come from it, are converted)."""
    for cmd in group.commands.values():
        if isinstance(cmd, click.Group):
            accept_catalog_anywhere(cmd)
        if not any("--catalog" in p.opts for p in cmd.params):
            cmd.params.insert(0, click.Option(
                ["--catalog"], type=click.Path(file_okay=False, path_type=str), expose_value=False, is_eager=True,
                callback=_late_catalog,
                help="Catalog directory (as `overlay --catalog DIR`; default: the shipped catalog)."))


def write_output(path: Path, data: bytes, make_dirs: bool = False) -> str:
    """`-o FILE` of any command: written atomically when changed (copier verb returned). FILE
    must be a regular file or new; the directory must exist unless `make_dirs` (compose render:
    no tree is created from a typo); anything the system refuses is one line naming FILE (exit 1)."""
    from ..fsutil import write_if_changed

    parent = path.parent if str(path.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise ManagerError(f"-o {path}: {parent} is not a directory")
    if not make_dirs and not parent.is_dir():
        raise ManagerError(f"-o {path}: directory {parent} does not exist (create it first)")
    if path.exists() and not path.is_file():
        raise ManagerError(f"-o {path}: exists and is not a regular file")
    try:
        return write_if_changed(path, data)
    except OSError as exc:
        raise ManagerError(f"-o {path}: cannot write: {exc.strerror or exc}") from None


@dataclass
class _Result:
    code: int = 0


def _crash_log(exc: BaseException) -> Path:
    log_dir = Path(os.environ.get("OVERLAY_CRASH_DIR", tempfile.gettempdir()))
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = log_dir / f"overlay-crash-{stamp}-{os.getpid()}.log"
    with open(path, "w") as fh:
        fh.write(f"overlay-manager {__version__}\n")
        fh.write(f"python {sys.version.split()[0]} on {platform.platform()}\n")
        fh.write(f"argv: {sys.argv!r}\n\n")
        fh.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    return path


@contextlib.contextmanager
def handle_errors() -> Iterator[_Result]:
    """exit 1: user error (one line); 130: Ctrl-C; 3: a bug, with a crash log."""
    result = _Result()
    try:
        yield result
    except ManagerError as exc:
        err.print(f"[red]error:[/red] {user_text(exc)}", markup=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        err.print("interrupted")
        sys.exit(130)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as exc:  # `overlay` (or a group) alone: its help, exit 0
        sys.stdout.write(exc.ctx.get_help() + "\n" if exc.ctx is not None else "")
        sys.exit(0)
    except click.UsageError as exc:  # one line, like every user error (exit 1, not click's 2)
        from rich.markup import escape

        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        err.print(f"[red]error:[/red] {escape(exc.format_message())}{escape(hint)}", markup=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code if exc.exit_code != 2 else 1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the bug path
        log = _crash_log(exc)
        err.print(f"[red]internal error:[/red] {type(exc).__name__}: {user_text(exc)}", markup=True)
        err.print(f"a crash log was written to {user_text(log)}; please attach it to a bug report")
        sys.exit(3)
