"""Every command, one module each, and ``main`` (the ``mae`` command) over them; ``commands`` is the one
table of subcommands. The LightningCLI commands (``pretrain``, ``finetune``, ``detect``, ``segment``) are
built in ``lightning``; every other is a ``build_parser()`` / ``run(args)`` / ``main(argv)`` as
``mae.cli.command`` describes (the data layer's ``shard`` and ``stats`` live in ``mae.data.tools``)."""
