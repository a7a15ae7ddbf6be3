"""Old spellings that keep working: one warning naming the new one (docs/cli.md, "One vocabulary").

When an option or a keyword argument is renamed to follow the vocabulary, its old spelling stays as a
hidden alias for a while: it does what the new one does and says what to write
instead. The command-line side is service_cli.option (common/processes/service_cli.py); this is the
Python side, and the one place both word their warning.
"""

import functools
import sys
import warnings


def renamed_message(old, new):
    return f"{old} is deprecated: use {new} (the same thing; {old} will be removed)"


def warn_renamed_option(old, new):
    """The command line's warning for a deprecated spelling, on stderr (once: an option is read once)."""
    print(f"Warning: {renamed_message(old, new)}", file=sys.stderr)


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
