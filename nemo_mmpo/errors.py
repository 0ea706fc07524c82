"""Errors raised by nemo-mmpo for bad input or configuration."""


class MMPOInputError(ValueError):
    """Input the estimators cannot use; the message names the offending value and the fix."""
