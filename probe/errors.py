"""The one exception type users see for bad input: a one-line message naming the culprit."""


class ConfigError(ValueError):
    """Bad configuration or input file. The message names the file, key or value and what is allowed."""
