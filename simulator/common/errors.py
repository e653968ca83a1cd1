"""The one error type users see: a bad value in a scenario, topology or command line."""


class ConfigError(ValueError):
    """A user-facing input error: one line naming the field, the bad value and what is valid.

    The CLI prints ``str(err)`` and exits with status 2; it never shows a traceback for these.
    """

    def __init__(self, field: str, value: object, valid: str):
        self.field = field
        self.value = value
        self.valid = valid
        super().__init__(f"{field}: got {yaml_text(value)}; {valid}")

    def __reduce__(self):
        # rebuilt from its three parts when it crosses a process boundary (a worker of validate,
        # sweep or plan): the default pickling passes only the message and cannot call __init__
        return (ConfigError, (self.field, self.value, self.valid))


def yaml_text(value: object) -> str:
    """The bad value as the user wrote it: YAML's null, true and false rather than Python's None,
    True and False (scenarios and ``--set`` values are YAML); anything else by its repr."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)
