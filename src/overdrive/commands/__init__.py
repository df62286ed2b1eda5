"""One module per subcommand: each `register(sub)` adds its parser; the work is in the library."""
