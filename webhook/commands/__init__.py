"""The command lines: one module per command family, the parser and the conventions.

``cli`` is ``webhook``: the shared parser and the handlers of the commands whose code is light;
``plugin`` is ``kubectl reservation``; ``console`` holds what every command shares (one-line
errors, documented exit codes, closed pipes, progress). A heavy command's flags live in a module
named after it (``audit``, ``plan``, ``rebalance``) beside a handler that imports the command's
body (``webhook.audit``, ``webhook.capacity``) only when it runs, so building the parser imports
nothing heavy. Commands may use everything below them; nothing imports them.
"""
