"""One module per benchmark command: a docstring (its help), add_arguments(parser) and run(args)."""
