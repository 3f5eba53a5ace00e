"""``python -m detload`` and the ``detload`` script: the command line, with signals handled from the start.

Until a command enters the part of its work that holds resources (`_signals.interruptible`),
Ctrl-C or SIGTERM ends the process at once with one line, ``interrupted`` (exit 130)
or ``terminated`` (exit 143): there is nothing to clean up, and a KeyboardInterrupt
raised while NumPy or pyarrow import would come out as an ImportError with a traceback.
The handlers are installed before anything else is imported (``_signal`` is the C
module: ``signal`` would first build its enums, a millisecond without a handler).
"""

import _signal
import os


def _early(signum: int, frame: object) -> None:
    os.write(2, b"interrupted\n" if signum == _signal.SIGINT else b"terminated\n")
    os._exit(130 if signum == _signal.SIGINT else 143)


def _install() -> None:
    _signal.signal(_signal.SIGINT, _early)
    _signal.signal(_signal.SIGTERM, _early)
    # For tests of the above (tests/test_cli.py): one byte on this fd once the handlers are in
    # place, so that they can send signals at random moments from here on.
    ready = os.environ.pop("DETLOAD_TEST_READY_FD", None)
    if ready:
        os.write(int(ready), b"R")
        os.close(int(ready))


if __name__ == "__main__":
    _install()

import atexit  # noqa: E402
import sys  # noqa: E402


def _exit(code: int) -> None:
    """Exit with ``code`` after the usual clean-up (atexit handlers, flushed streams).

    Not through the interpreter's own exit: CPython marks a KeyboardInterrupt as unhandled
    whenever one ends code run by ``exec`` of a string (dataclasses and namedtuples are made
    so), even when it was caught, and ``python -m`` then exits by SIGINT whatever the status.
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(code)


def run() -> None:
    """The console entry point."""
    if _signal.getsignal(_signal.SIGINT) is not _early:
        _install()
    from .cli import main

    _exit(main(_process=True))  # returns with both signals ignored


if __name__ == "__main__":
    run()
