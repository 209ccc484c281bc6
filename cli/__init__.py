"""The ``paraplan`` command line: each command parses its flags, calls the library and renders."""
