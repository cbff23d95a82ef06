"""The one exception type users see for bad input: a one-line message naming the culprit."""


class ConfigError(ValueError):
    """Bad configuration or input file. The message names the file, key or value and what is allowed."""


class DrawMismatch(ConfigError):
    """A bench run given ``random_from`` made a random call the NPU run's draws do not fit
    (another call sequence, shape or p). The message names the call, the step and what differs."""
