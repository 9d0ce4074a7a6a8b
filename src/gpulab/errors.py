"""The one shape of a bad-input error: which field, and what is allowed (HTTP 400 at the API)."""


class FieldError(ValueError):
    """Bad input; ``field`` names it (dotted for nested ones), the message says what to fix."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)
