"""The one error type users see: a bad value in a scenario, topology or command line."""


class ConfigError(ValueError):
    """A user-facing input error: one line naming the field, the bad value and what is valid.

    The CLI prints ``str(err)`` and exits with status 2; it never shows a traceback for these.
    """

    def __init__(self, field: str, value: object, valid: str):
        self.field = field
        self.value = value
        self.valid = valid
        super().__init__(f"{field}: got {value!r}; {valid}")
