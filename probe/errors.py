"""The one exception type users see for bad input: a one-line message naming the culprit."""
import difflib


class ConfigError(ValueError):
    """Bad configuration or input file. The message names the file, key or value and what is allowed."""


def did_you_mean(value, allowed) -> str:
    """`` did you mean 'dump_path'?`` for a misspelt ``value`` among ``allowed``, else ''."""
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.6)
    return f" did you mean {close[0]!r}?" if close else ""


def unknown(what, value, allowed) -> str:
    """The message for a value outside ``allowed``: ``unknown key 'dump_pth'; did you mean
    'dump_path'? allowed: ...``."""
    hint = did_you_mean(value, allowed)
    return f"unknown {what} {value!r};{hint} allowed: {', '.join(map(str, allowed))}"


class DrawMismatch(ConfigError):
    """A bench run given ``random_from`` made a random call the NPU run's draws do not fit
    (another call sequence, shape or p). The message names the call, the step and what differs."""


class DumpError(ConfigError):
    """A dump's file that probe refuses to read: malformed (not UTF-8 JSON, wrong types,
    nested too deeply), hostile (a name leaving the dump's folder, a FIFO or a device) or
    unsafe to load (a pickle). The message names the file, the entry and what is wrong;
    the CLI prints it as one line and exits 2 (a ConfigError, so one ``except`` catches both)."""
