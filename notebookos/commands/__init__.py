"""One module per ``notebookos`` subcommand (see notebookos.cli)."""
