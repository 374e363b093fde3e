"""The `octlm` command: every subcommand's flags and handler."""
