"""The ``ksearch`` command: its parser and commands (``main``), the commands that drive a search, the live view."""
