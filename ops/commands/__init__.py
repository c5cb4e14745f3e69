"""One module per `flotilla` subcommand: add_parser(subparsers) and a handler(args, console)."""
