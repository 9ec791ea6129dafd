"""The command lines: one module per command, the parsers that register them, the conventions.

Laid out as kubectl is: each ``webhook`` command is a module named after it (``evaluate``,
``review``, ``report``, ``guard``, ``serve``, ``certs``, ``plan``, ``rebalance``, ``audit``,
``contract_schema``, ``completion``) holding its flags and its handler, and no command imports
another; ``cli`` is ``webhook``'s parser, which registers them all; ``options`` holds the flags
several of them share (``--state``, the record keys, the overcommit rules); ``plugin`` is
``kubectl reservation``, laid out the same way; ``console`` holds what every command shares
(one-line errors, documented exit codes, closed pipes, progress). A handler imports the
command's body (``webhook.admission``, ``webhook.capacity``, ``webhook.audit``, the server) only
when it runs, so building a parser imports nothing heavy. Commands may use everything below
them; nothing imports them.
"""
