"""The `vflnet` subcommands that belong to no one package (run, party, config, the registry listings),
one module each with ``build_parser()`` and ``main(argv)``; vflnet/cli.py lists every command."""
