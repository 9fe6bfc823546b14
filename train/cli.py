"""The command line of the commands that take a SOURCE (train.evaluate, train.sample): the
command's own options, then the options of the SOURCE's model family, each family's in a parser of
its own, so two families may name an option alike (GPT's sampler and another's `--start`).

    command = FamilyCommand(prog, doc, add_common, part)   # part(Family) -> Evaluation / Sampler
    args, fam, options = command.parse(argv, family_of)    # family_of(SOURCE) -> (name, Family)

Parsing runs in two passes: the first finds SOURCE (the first argument that is neither an option
nor an option's value); `family_of` names its family cheaply (a run's
config.yaml, a weights file's kind); the second parses the whole line with the command's options
and that family's alone, so argparse's own one-line errors name the option. `--help` lists the
command's options and then every registered family's, family by family. A family option that
takes the name of one of the command's, or takes a value where another registered family's option
of that name does not (SOURCE could not be found), is one line naming both.
"""

from __future__ import annotations

import argparse
import inspect
import sys

from train import families
from train.errors import ConfigError, OneLineParser


class FamilyCommand:
    """A command whose options depend on its SOURCE's family (see the module docstring).

    `add_common(parser)`: the command's own arguments, SOURCE (dest `source`) first.
    `part(family)`: the family's piece of the command (an object with `add_arguments(parser)`),
    None when the family takes no part in it. `overrides`: the command takes `key=value`
    positionals after SOURCE (train.evaluate)."""

    def __init__(self, prog: str, doc: str, add_common, part, *, overrides: bool = False):
        self.prog, self.doc, self.add_common, self.part = prog, doc, add_common, part
        self.overrides = overrides

    # --- parsers ----------------------------------------------------------------------------------
    def _common(self, **kwargs) -> argparse.ArgumentParser:
        p = OneLineParser(prog=self.prog, **kwargs)
        self.add_common(p)
        return p

    def _family_parser(self, name: str, piece) -> argparse.ArgumentParser:
        """The command's options plus the family's, or one line naming both when they clash."""
        p = self._common(description=self.doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        try:
            piece.add_arguments(p.add_argument_group(f"{name} options"))
        except argparse.ArgumentError as e:
            raise ConfigError(
                f"{self.prog}: family {name!r} defines {e.argument_name}, an option of the "
                "command itself; rename the family's option"
            ) from e
        return p

    def _pieces(self) -> dict:
        return {n: p for n, f in families.registered().items() if (p := self.part(f)) is not None}

    def help(self) -> str:
        """The command's help, then each registered family's options under its name."""
        sections = [self._common(description=self.doc, formatter_class=_Raw).format_help()]
        for name, piece in self._pieces().items():
            p = argparse.ArgumentParser(prog=self.prog, usage=argparse.SUPPRESS, add_help=False,
                                        description=_doc(name, piece), formatter_class=_Raw)  # fmt: skip
            piece.add_arguments(p.add_argument_group(f"{name} options"))
            sections.append(p.format_help())
        return "\n".join(sections)

    # --- the two passes -------------------------------------------------------------------------
    def source(self, argv: list[str]) -> str | None:
        """SOURCE, found without knowing its family: options of the command and of every
        registered family tell which arguments are option values."""
        takes_value = _takes_value(self._common(add_help=False), "the command")
        for name, piece in self._pieces().items():
            p = argparse.ArgumentParser(add_help=False)
            piece.add_arguments(p)
            for option, (value, owner) in _takes_value(p, name).items():
                known = takes_value.get(option)
                if known is not None and known[0] != value:
                    raise ConfigError(
                        f"{self.prog}: option {option} takes a value for {known[1]} and none for "
                        f"{owner} (or the reverse): SOURCE cannot be told from the options"
                    )
                takes_value.setdefault(option, (value, owner))
        args = iter(argv)
        for arg in args:
            if arg == "--":
                return next(args, None)
            if arg.startswith("-") and arg != "-":
                option = arg.split("=", 1)[0]
                if option not in takes_value:
                    raise ConfigError(
                        f"{self.prog}: {option} is not an option of the command or of a registered "
                        "family; put SOURCE first when it is an option of SOURCE's family"
                    )
                if takes_value[option][0] and "=" not in arg:
                    next(args, None)
                continue
            return arg
        return None

    def parse(self, argv: list[str] | None, family_of):
        """-> (args, the source's Family, the family's options given: dest -> value) after both
        passes; `--help` prints every family's options and exits."""
        argv = sys.argv[1:] if argv is None else list(argv)
        if any(a in ("-h", "--help") for a in argv[: argv.index("--") if "--" in argv else None]):
            print(self.help())
            sys.exit(0)
        source = self.source(argv)
        if source is None:
            self._common().parse_args(argv)  # argparse's one line: SOURCE is required
        name, fam = family_of(source)
        piece = self.part(fam)
        if piece is None:
            return self._common().parse_args(argv), fam, {}
        parser = self._family_parser(name, piece)
        args = parser.parse_intermixed_args(argv) if self.overrides else parser.parse_args(argv)
        own = argparse.ArgumentParser(add_help=False)
        piece.add_arguments(own)
        defaults = vars(own.parse_args([]))
        given = {k: getattr(args, k) for k, d in defaults.items() if getattr(args, k) != d}
        return args, fam, given


class _Raw(argparse.RawDescriptionHelpFormatter):
    pass


def _takes_value(parser: argparse.ArgumentParser, owner: str) -> dict[str, tuple[bool, str]]:
    """option string -> (whether it takes a value, `owner`)."""
    return {
        option: (action.nargs != 0, owner)
        for action in parser._actions  # argparse's list of the parser's arguments
        for option in action.option_strings
    }


def _doc(name: str, piece) -> str:
    """The family's section: its module's docstring when the piece is its own, else one line."""
    module = inspect.getmodule(type(piece))
    if module is None or module.__name__ == "train.task":  # the default piece of train/task.py
        return f"{name}: the trainer's own evaluation of the checkpoint (Task.evaluate); no options"
    return f"{name}: {inspect.getdoc(module) or inspect.getdoc(type(piece))}"
