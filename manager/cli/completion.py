"""`overlay completion bash|zsh|fish`: the shell script that completes commands and values.

Values (overlay ids, deployment slugs, profile ids, engine/hardware/model ids) come from the
catalog through the parameter types in `params.py`; click's completion protocol does the rest
(`_OVERLAY_COMPLETE=<shell>_complete overlay ...`).
"""

from __future__ import annotations

import click

from ..console import print_data

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_OVERLAY_COMPLETE"

INSTALL = {
    "bash": 'eval "$(overlay completion bash)"      # in ~/.bashrc (bash >= 4.4)',
    "zsh": 'eval "$(overlay completion zsh)"       # in ~/.zshrc',
    "fish": "overlay completion fish > ~/.config/fish/completions/overlay.fish",
}


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion_cmd(shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish).

    \b
    bash:  eval "$(overlay completion bash)"   (in ~/.bashrc)
    zsh:   eval "$(overlay completion zsh)"    (in ~/.zshrc)
    fish:  overlay completion fish > ~/.config/fish/completions/overlay.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None  # click ships all three
    print_data(cls(click.get_current_context().find_root().command, {}, "overlay", COMPLETE_VAR).source())


def register(cli: click.Group) -> None:
    """Add this area's commands to the root `overlay` group."""
    for cmd in (completion_cmd,):
        cli.add_command(cmd)
