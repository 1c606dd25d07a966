"""The CLI's exit codes (the README's exit code table)."""

EXIT_OK = 0  # ok; for run: the cycle finished clean or unsettled
EXIT_FAILED = 1  # run: the cycle failed; demo: its self-check failed
EXIT_NOT_FOUND = 1  # explain: nothing recorded
EXIT_BAD_INPUT = 2  # arguments, settings, unknown or off backend, database unreachable or not migrated
EXIT_BUSY = 3  # another live cycle holds the backend's lease
EXIT_INTERRUPTED = 130  # run: Ctrl-C
