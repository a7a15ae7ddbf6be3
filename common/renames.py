"""Old spellings that keep working: one warning naming the new one (docs/cli.md, "One vocabulary").

When an option, a keyword argument or an environment variable is renamed to follow the vocabulary, its old
spelling stays as a hidden alias for a while: it does what the new one does and says what to write instead.
The command-line side is service_cli.option (common/processes/service_cli.py); this is the Python and the
environment's side, and the one place all of them word their warning.
"""

import functools
import os
import sys
import warnings


def renamed_message(old, new):
    return f"{old} is deprecated: use {new} (the same thing; {old} will be removed)"


def warn_renamed_option(old, new):
    """The command line's warning for a deprecated spelling, on stderr (once: an option is read once)."""
    print(f"Warning: {renamed_message(old, new)}", file=sys.stderr)


def read_environment(name, old=None, environ=None):
    """The environment variable `name`, else its `old` name's value with one warning naming `name` (docs/cli.md,
    "Environment variables"); None when neither is set (an empty value counts as unset, as click does)."""
    environ = os.environ if environ is None else environ
    if environ.get(name):
        return environ[name]
    if old and environ.get(old):
        warn_renamed_option(old, name)
        return environ[old]
    return None


def renamed_keywords(**renames):
    """A decorator: each `old=new` keyword argument of the function is still accepted under its old name,
    with a DeprecationWarning naming the new one; giving both is a TypeError."""
    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{function.__qualname__}() got {old}= and {new}=: give {new}= only")
                    warnings.warn(renamed_message(f"{old}=", f"{new}="), DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)
        wrapper.renamed_keywords = dict(renames)
        return wrapper
    return decorate
